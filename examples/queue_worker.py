"""A work queue: workers pop jobs, publish results and ack in one transaction.

Three workers share queue "resize" of topic "images": each job goes to one worker at a
time under a lease. A worker publishes its result and acks the job in the same
transaction, so a result exists if and only if its job counts as done. One worker
gives a job back (nack) and another picks it up; one job fails every time and ends in
the dead-letter topic after two deliveries. Run a server first (``tidings serve``), then::

    python examples/queue_worker.py --url http://127.0.0.1:8470
"""

from __future__ import annotations

import argparse
import uuid

import tidings


def main(url: str) -> None:
    jobs, results = "images-" + uuid.uuid4().hex[:8], "thumbnails-" + uuid.uuid4().hex[:8]
    with tidings.Client(url) as client:
        client.create_topic(jobs)
        client.create_topic(results)
        client.publish(jobs, [f"image {i}".encode() for i in range(9)] + [b"broken image"])

        workers = [client.queue(jobs, "resize", ack_timeout=30, max_deliveries=2) for _ in range(3)]
        done = 0
        while True:
            progress = False
            for n, worker in enumerate(workers):
                batch = worker.pop(max_messages=2)
                if not batch:
                    continue
                progress = True
                good = [m for m in batch if m.payload != b"broken image"]
                bad = [m for m in batch if m.payload == b"broken image"]
                if bad:
                    print(f"worker {n}: cannot do {bad[0].payload.decode()!r} "
                          f"(delivery {bad[0].delivery_count}): nack")  # fmt: skip
                    worker.nack(bad)
                if good:
                    with client.transaction() as tx:
                        tx.publish(results, [b"thumbnail of " + m.payload for m in good])
                        worker.ack(good, transaction=tx)  # done iff the result exists
                    done += len(good)
            if not progress:
                break
        for worker in workers:
            worker.close()

        print(f"jobs done: {done}")
        print(f"results: {len(client.poll(results, limit=100))}")
        dead = client.poll(jobs + "-dlq", limit=10)
        print(f"dead letters: {[m.payload.decode() for m in dead]}")
        stats = client.describe_queue(jobs, "resize")
        print(f"queue resize: acked {stats.acked}, waiting {stats.waiting}, "
              f"pending {stats.pending}, dead-lettered {stats.dead_lettered}")  # fmt: skip
        for topic in (jobs, results, jobs + "-dlq"):
            client.delete_topic(topic)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470", help="the server's URL")
    try:
        main(parser.parse_args().url)
    except tidings.TidingsError as exc:
        # No server at --url (not started yet, say) is one line, not a traceback.
        raise SystemExit(f"Error: {type(exc).__name__}: {exc}") from None
