"""One sequence of CL.THROTTLE calls replayed through redis-py against redis-server with the
redis-cell module and against floodgate's Redis front, step by step, replies compared: limited,
limit and remaining exactly (remaining within what the limit earns over the step's own timing,
for limits fast enough to earn a token in it), retry_after and reset_after within one second,
errors word for word.

Usage: resp_conformance.py REDIS_PORT FLOODGATE_PORT. Prints one line per step and exits 1 on any
difference. `resp_conformance.py --sequence` prints the sequence as JSON instead, for the other
clients' runs (resp_conformance_go) to replay, so every client replays the same calls.
"""

import json
import math
import sys
import time

import redis


def sequence():
    """(args) of each call: bursts, peeks, quantities over the limit, errors, a key reused with
    other parameters, short and long intervals."""
    calls = []
    for _ in range(7):
        calls.append(("cl.throttle", "user:1", 4, 1, 3600))
    calls.append(("cl.throttle", "user:1", 4, 1, 3600, 0))
    calls.append(("cl.throttle", "user:1", 9, 1, 3600, 2))
    # Reused with a capacity at least its debt (a smaller one is where floodgate differs:
    # docs/RESP.md).
    calls.append(("cl.throttle", "user:1", 19, 2, 3600, 7))
    calls.append(("cl.throttle", "user:1", 19, 2, 3600, 15))
    calls.append(("cl.throttle", "user:1", 19, 2, 3600, 1))
    for q in (0, 3, 6, 5, 1, 0):
        calls.append(("cl.throttle", "upload", 4, 1, 60, q))
    for _ in range(4):
        calls.append(("CL.THROTTLE", "thirds", 2, 3, 1))
    for _ in range(3):
        calls.append(("CL.THROTTLE", "sevenths", 5, 7, 10, 2))
    for _ in range(3):
        calls.append(("CL.THROTTLE", "fast", 100, 1000, 1, 40))
    for _ in range(3):
        calls.append(("CL.THROTTLE", "day", 0, 1, 86400))
    calls.append(("CL.THROTTLE", "usage", 1, 1))
    calls.append(("CL.THROTTLE", "usage", 1, 1, 1, 1, 1))
    calls.append(("CL.THROTTLE", "parse", "x", 1, 1))
    calls.append(("CL.THROTTLE", "parse", 1, "1.5", 1))
    calls.append(("CL.THROTTLE", "parse", 1, 1, "", 1))
    calls.append(("CL.THROTTLE", "parse", 1, 1, 1, "two"))
    return calls


def call(client, args):
    try:
        return [int(x) for x in client.execute_command(*args)]
    except redis.exceptions.ResponseError as error:
        return "error: " + str(error)


def drift(args, seconds):
    """Tokens the call's limit earns in `seconds` (0 without a limit): how far `remaining` may
    differ between two servers whose clocks were read up to that far apart relative to the
    key's previous call. Within a hundredth of a token it is taken as none, so slow limits are
    compared exactly; a limit of a token a millisecond (the `fast` steps) earns several in one
    round trip's jitter on a busy machine."""
    try:
        count, period = int(args[3]), int(args[4])
    except (IndexError, ValueError):
        return 0
    if count <= 0 or period <= 0:
        return 0
    tokens = seconds * count / period
    return 0 if tokens < 0.01 else math.ceil(tokens)


def same(expected, got, tolerance=0):
    if isinstance(expected, str) or isinstance(got, str):
        return expected == got
    if expected[:2] != got[:2] or abs(expected[2] - got[2]) > tolerance:
        return False
    return all(
        (e == -1) == (g == -1) and abs(e - g) <= 1 for e, g in zip(expected[3:], got[3:])
    )


def main():
    if sys.argv[1:] == ["--sequence"]:
        print(json.dumps(sequence()))
        return
    redis_port, floodgate_port = int(sys.argv[1]), int(sys.argv[2])
    cell = redis.Redis(host="127.0.0.1", port=redis_port, socket_timeout=10)
    gate = redis.Redis(host="127.0.0.1", port=floodgate_port, socket_timeout=10)
    # The handshake redis-py makes (CLIENT SETINFO, HELLO when asked) passes on both.
    for client in (cell, gate):
        assert client.ping() is True
    differences = 0
    # Per key, how long its previous step took: both servers read their clocks within it.
    took = {}
    for step, args in enumerate(sequence()):
        start = time.monotonic()
        expected, got = call(cell, args), call(gate, args)
        now = time.monotonic()
        slack = (now - start) + took.get(args[1], 0.0)
        took[args[1]] = now - start
        ok = same(expected, got, drift(args, slack))
        differences += not ok
        print(f"{'ok  ' if ok else 'DIFF'} {step:2} {' '.join(map(str, args))}: "
              f"redis-cell {expected} floodgate {got}")
    # A pipeline of mixed calls, one round trip each.
    replies = []
    for client in (cell, gate):
        pipe = client.pipeline(transaction=False)
        for i in range(12):
            pipe.execute_command("CL.THROTTLE", f"piped:{i % 3}", 2, 1, 3600)
        replies.append([[int(x) for x in r] for r in pipe.execute(raise_on_error=False)])
    for i, (expected, got) in enumerate(zip(*replies)):
        ok = same(expected, got)
        differences += not ok
        print(f"{'ok  ' if ok else 'DIFF'} pipelined {i}: redis-cell {expected} floodgate {got}")
    # RESP3 on floodgate (HELLO 3 through redis-py's protocol=3).
    resp3 = redis.Redis(host="127.0.0.1", port=floodgate_port, protocol=3, socket_timeout=10)
    reply = [int(x) for x in resp3.execute_command("CL.THROTTLE", "resp3", 1, 1, 60)]
    print(f"resp3: {reply}")
    differences += reply != [0, 2, 1, -1, 60]
    print(f"{differences} differences")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
