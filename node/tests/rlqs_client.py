"""Drives floodgate's RLQS stream with the envoy-data-plane package (a client floodgate did not
write) as Envoys do, and prints one line per observation; node/tests/rlqs.rs asserts on them.

Usage: rlqs_client.py HOST:PORT  (a node started with rlqs.rs's configuration, fresh state,
idle_reports_before_abandon = 2)
"""

import datetime
import queue
import signal
import sys

import grpc
from envoy_data_plane.envoy.service.rate_limit_quota.v3 import (
    BucketId,
    RateLimitQuotaServiceSyncStub,
    RateLimitQuotaUsageReports,
    RateLimitQuotaUsageReportsBucketQuotaUsage as Usage,
)

LIMIT = 600  # name=minute: 600 per minute


class Envoy:
    """One stream, as one Envoy holds per domain: reports go in a queue, answers come out."""

    def __init__(self, stub, domain="edge"):
        self.domain = domain
        self.outbox = queue.Queue()

        def messages():
            while True:
                message = self.outbox.get()
                if message is None:
                    return
                yield message

        self.answers = stub.stream_rate_limit_quotas(messages())

    def send(self, *usages):
        self.outbox.put(
            RateLimitQuotaUsageReports(domain=self.domain, bucket_quota_usages=list(usages))
        )

    def next(self):
        return next(self.answers)

    def report(self, *usages):
        self.send(*usages)
        return self.next()

    def close(self):
        self.outbox.put(None)


def usage(name, allowed, denied=0, elapsed=5):
    return Usage(
        bucket_id=BucketId(bucket={"name": name}),
        time_elapsed=datetime.timedelta(seconds=elapsed),
        num_requests_allowed=allowed,
        num_requests_denied=denied,
    )


def token_bucket(answer, name="minute"):
    for action in answer.bucket_action:
        if action.bucket_id.bucket == {"name": name}:
            return action.quota_assignment_action.rate_limit_strategy.token_bucket
    raise AssertionError(f"no assignment for {name}: {answer}")


def main():
    # Bounded whatever happens: SIGALRM's default action ends the process.
    signal.alarm(60)
    channel = grpc.insecure_channel(sys.argv[1])
    grpc.channel_ready_future(channel).result(timeout=10)
    stub = RateLimitQuotaServiceSyncStub(channel)

    # A new bucket is reported at once with allowed=1, and answered at once.
    one = Envoy(stub)
    answer = one.report(usage("minute", 1, elapsed=0))
    action = answer.bucket_action[0]
    assert action.bucket_id.bucket == {"name": "minute"}
    quota = action.quota_assignment_action
    tb = quota.rate_limit_strategy.token_bucket
    print(
        f"first: token_bucket max_tokens={tb.max_tokens} tokens_per_fill={tb.tokens_per_fill} "
        f"fill_interval={int(tb.fill_interval.total_seconds())}s "
        f"ttl={int(quota.assignment_time_to_live.total_seconds())}s"
    )

    # The first Envoy is busy; a second one joins and gets at least the floor, the first is
    # pushed its smaller share without asking.
    one.report(usage("minute", 300, 900))
    two = Envoy(stub)
    newcomer = token_bucket(two.report(usage("minute", 1, elapsed=0))).tokens_per_fill
    incumbent = token_bucket(one.next()).tokens_per_fill
    floor = (LIMIT - 2) // 4
    print(
        f"joined: sum_within_limit={2 + incumbent + newcomer <= LIMIT} "
        f"newcomer_at_least_floor={newcomer >= floor}"
    )
    print(f"pushed: first_shrank={incumbent < tb.tokens_per_fill}")

    # The first stream closes: its Envoy may still enforce its assignment until it expires, so
    # the second does not get those tokens yet.
    one.close()
    kept = token_bucket(two.report(usage("minute", 2))).tokens_per_fill
    print(f"closed: sum_within_limit={2 + incumbent + kept <= LIMIT}")

    # Two reports with no requests: the bucket is abandoned.
    two.report(usage("minute", 0))
    answer = two.report(usage("minute", 0))
    print("idle: " + ("abandon" if answer.bucket_action[0].abandon_action is not None else "?"))

    # An unlimited rule: everything passes.
    answer = two.report(usage("free", 1, elapsed=0))
    quota = answer.bucket_action[0].quota_assignment_action
    rule = quota.rate_limit_strategy.blanket_rule
    print(
        f"unlimited: {rule.name.lower()} "
        f"ttl={int(quota.assignment_time_to_live.total_seconds())}s"
    )
    two.close()

    # A domain no file configures ends the stream with a clear status.
    stranger = Envoy(stub, domain="nowhere")
    try:
        stranger.report(usage("minute", 1, elapsed=0))
        print("unknown domain: answered")
    except grpc.RpcError as e:
        print(f"unknown domain: {e.code().name}")
    stranger.close()
    # Cancels what is still open and stops grpcio's threads before the interpreter exits: a
    # channel left open with streams on it can take the process down at exit.
    channel.close()


if __name__ == "__main__":
    main()
