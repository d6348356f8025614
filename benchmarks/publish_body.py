"""What a publish body costs on each side before the store write, per batch of 500.

In one process, for plain payloads of 100 B and of 1 KiB, and for 100 B payloads with
a key each:

- client: the body of a publish, in the extended Avro schema the clients used before
  (``wire.encode_publish_request``) and in the payloads body they send now
  (``payload_frames.write_frames``);
- server: from the body to the values of the store write, as the publish route and
  ``MessagingService.publish`` get there: the Avro body decoded, its batch encoded and
  its batch entries made, against the payloads body read and its batch entry made.

Each figure is the best of ``--rounds`` timings of ``--calls`` calls, in µs per batch.

    python -m benchmarks.publish_body [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

from tidings.codec import payload_frames, values, wire
from tidings.codec.media import AVRO_EXT
from tidings.messaging import publishing
from tidings.structs import Record

BATCH = 500


def _best(fn: Callable[[], object], calls: int, rounds: int) -> float:
    """The best of ``rounds`` timings of ``calls`` calls of ``fn``, µs per call."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


def _avro_server(body: bytes) -> object:
    request = wire.decode_publish_request(body, AVRO_EXT, stored_for="publish")
    batch = publishing.encode_batch(request.records, None, 0)
    return publishing._batch_entries(batch)


def _payloads_server(body: bytes) -> object:
    request = wire.decode_payloads_request(body)
    batch = publishing.encode_batch(request.records, None, 0)
    return publishing._batch_entries(batch)


def _stored(entries: object) -> list[bytes]:
    """The payloads of the batch entries made for one publish."""
    out: list[bytes] = []
    assert isinstance(entries, list)
    for _, value in entries:
        count, ends, starts = values.batch_layout(value)
        out += [value[starts[i] : ends[i + 1]] for i in range(count)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"µs per batch of {BATCH}, best of {args.rounds} x {args.calls} calls")
    print(f"{'messages':>14}  {'side':<7} {'Avro (schema=tidings)':>22} {'payloads body':>14}")
    for size, keyed in ((100, False), (1024, False), (100, True)):
        payloads = [os.urandom(size) for _ in range(BATCH)]
        messages: list[Record | bytes] = list(payloads)
        if keyed:  # a key each, of a hundred keys, as a keyed topic's producers send
            messages = [Record(p, b"key-%d" % (i % 100)) for i, p in enumerate(payloads)]
        avro_body = wire.encode_publish_request(None, messages, AVRO_EXT)
        frames_body = payload_frames.write_frames(None, messages)
        # Both must store the same messages, or the comparison means nothing.
        assert _stored(_avro_server(avro_body)) == _stored(_payloads_server(frames_body))
        calls, rounds = args.calls, args.rounds
        client = (
            _best(partial(wire.encode_publish_request, None, messages, AVRO_EXT), calls, rounds),
            _best(partial(payload_frames.write_frames, None, messages), calls, rounds),
        )
        server = (
            _best(partial(_avro_server, avro_body), calls, rounds),
            _best(partial(_payloads_server, frames_body), calls, rounds),
        )
        what = f"{size} B" + (", keyed" if keyed else "")
        for side, (avro, frames) in (("client", client), ("server", server)):
            print(f"{what:>14}  {side:<7} {avro:>22.1f} {frames:>14.1f}")


if __name__ == "__main__":
    main()
