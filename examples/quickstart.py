"""Tidings in two minutes: a topic, a publish, a consumer, the background publisher.

Run a server first (``tidings serve``), then::

    python examples/quickstart.py --url http://127.0.0.1:8470
"""

from __future__ import annotations

import argparse
import uuid

import tidings


def main(url: str) -> None:
    topic = "quickstart-" + uuid.uuid4().hex[:8]
    with tidings.Client(url) as client:
        client.create_topic(topic, ttl=3600)

        # publish() returns once the messages are durable.
        client.publish(topic, [b"hello", "world"])
        client.publish(topic, tidings.Record(b"order 42 shipped", key=b"42", headers={"v": b"1"}))

        # Consume from the beginning; follow=False stops once caught up.
        for message in client.consume(topic, "earliest", follow=False):
            print(f"{message.id}  key={message.key!r}  {message.payload.decode()}")

        # The background publisher batches; each send gets a future.
        with client.publisher(linger=0.01) as publisher:
            futures = [publisher.send(topic, f"event {i}") for i in range(100)]
            publisher.flush()
        print(f"background publisher: {sum(f.exception() is None for f in futures)} sent")

        stats = client.stats(topic)
        print(f"{topic}: {stats.message_count} messages, {stats.bytes} bytes")
        client.delete_topic(topic)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470", help="the server's URL")
    try:
        main(parser.parse_args().url)
    except tidings.TidingsError as exc:
        # No server at --url (not started yet, say) is one line, not a traceback.
        raise SystemExit(f"Error: {type(exc).__name__}: {exc}") from None
