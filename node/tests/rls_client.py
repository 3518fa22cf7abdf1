"""Drives floodgate's RLS v3 service with the envoy-data-plane package (a client floodgate did
not write) and prints one line per observation; node/tests/rls.rs asserts on the lines.

Usage: rls_client.py HOST:PORT  (a node started with rls.rs's configuration, fresh counters)
"""

import signal
import sys

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
    RateLimitDescriptorRateLimitOverride,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitServiceSyncStub,
)
from envoy_data_plane.envoy.type.v3 import RateLimitUnit


def descriptor(*entries, hits=None, override=None):
    d = RateLimitDescriptor(
        entries=[RateLimitDescriptorEntry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend = hits
    if override is not None:
        d.limit = RateLimitDescriptorRateLimitOverride(
            requests_per_unit=override, unit=RateLimitUnit.DAY
        )
    return d


def main():
    # Bounded whatever happens: SIGALRM's default action ends the process.
    signal.alarm(60)
    channel = grpc.insecure_channel(sys.argv[1])
    grpc.channel_ready_future(channel).result(timeout=10)
    stub = RateLimitServiceSyncStub(channel)

    def ask(*descriptors, hits=0, domain="edge"):
        return stub.should_rate_limit(
            RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits)
        )

    three = lambda **kw: descriptor(("generic_key", "three"), **kw)
    ten = lambda **kw: descriptor(("generic_key", "ten"), **kw)

    for _ in range(3):
        ask(three())
    r = ask(three())
    s = r.statuses[0]
    print(
        f"fourth: overall={r.overall_code.name} code={s.code.name} "
        f"remaining={s.limit_remaining} "
        f"limit={s.current_limit.requests_per_unit}/{s.current_limit.unit.name} "
        f"name={s.current_limit.name}"
    )
    headers = {h.key: h.value for h in r.response_headers_to_add}
    print(f"fourth headers: RateLimit-Policy={headers['RateLimit-Policy']}")
    denied_by = r.dynamic_metadata.fields["denied_by"].string_value
    print(f"fourth metadata: denied_by={denied_by}")

    # three is exhausted: a request with ten and three is denied and takes nothing from ten.
    ask(ten())
    r = ask(ten(), three())
    print(
        f"denied pair: overall={r.overall_code.name} "
        f"codes={','.join(s.code.name for s in r.statuses)} "
        f"remaining={','.join(str(s.limit_remaining) for s in r.statuses)}"
    )
    r = ask(ten())
    print(f"ten after denial: remaining={r.statuses[0].limit_remaining}")

    r = ask(ten(hits=0))
    print(f"peek: overall={r.overall_code.name} remaining={r.statuses[0].limit_remaining}")
    r = ask(ten(), hits=3)
    print(f"request hits 3: remaining={r.statuses[0].limit_remaining}")

    for n in (2, 3):
        r = ask(three(override=n))
        s = r.statuses[0]
        print(f"override {n}: remaining={s.limit_remaining} limit={s.current_limit.requests_per_unit}")

    r = ask(descriptor(("nothing", "here")))
    print(f"no match: overall={r.overall_code.name} has_limit={r.statuses[0].current_limit is not None}")
    r = ask(descriptor(("user", "admin")))
    print(f"unlimited: overall={r.overall_code.name} has_limit={r.statuses[0].current_limit is not None}")
    ask(descriptor(("shadow", "py")))
    r = ask(descriptor(("shadow", "py")))
    print(f"shadow: overall={r.overall_code.name}")


if __name__ == "__main__":
    main()
