"""The ``tidings`` command: run the server, administer topics, publish, consume, inspect.

Every command but ``serve``, ``inspect`` and ``backup`` talks to a server through
:class:`tidings.Client` (``--url``, ``--namespace``). A Tidings error prints one line,
``Error: <Class>: <what and why>``, and exits 1; bad usage exits 2 (click). See
docs/cli.md.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import os
import queue as _queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click
import orjson

from tidings.errors import (
    BackupFailed,
    ConfigError,
    TidingsError,
    TransactionInvalid,
    TransactionTimedOut,
)
from tidings.names import DEFAULT_URL, INT64_MAX, MAX_TTL
from tidings.structs import MessageId, Record

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from tidings.client import Client
    from tidings.store.backend import ReadView
    from tidings.structs import Message

__all__ = ["main"]


_T = TypeVar("_T")


@dataclass
class _Settings:
    url: str
    namespace: str
    token: str | None = None
    cacert: Path | None = None
    transactions_url: str | None = None
    timeout: float | None = None


class _UsageProblem(click.ClickException):
    """A usage error shown as one line (click's own shows the usage text above it)."""

    exit_code = 2


def _one_line(exc: click.UsageError) -> click.ClickException:
    where = exc.ctx.command_path if exc.ctx is not None else "tidings"
    # The message quotes what was given: a line break in an argument stays in the line.
    message = _escape_controls(exc.format_message().rstrip("."))
    return _UsageProblem(f"{message} (see '{where} --help')")


class _Seconds(click.FloatRange):
    """A number of seconds: infinity and NaN are refused as wrong usage (the client
    refuses them, and that was a traceback)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


class _Main(click.Group):
    """The root group: every Tidings error is one line and exit status 1, every usage
    error one line and exit status 2; neither shows a traceback."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # shows the help, as asked
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # a subcommand's arguments, or a check of ours
            raise _one_line(exc) from None
        except TidingsError as exc:
            # The message may come from the server (or whatever answers at the URL):
            # a line break in it must not make two lines, nor an escape reach the terminal.
            message = _escape_controls(exc.message)
            raise click.ClickException(f"{type(exc).__name__}: {message}") from None
        except click.ClickException as exc:  # ours, naming a path or topic as given
            exc.message = _escape_controls(exc.message)
            raise
        except BrokenPipeError:
            # The reader went away (``tidings consume t | head``): not an error. Point
            # stdout at /dev/null so the interpreter's final flush does not fail again.
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)


@click.group(cls=_Main)
@click.version_option(package_name="tidings")
@click.option(
    "--url",
    envvar="TIDINGS_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The server's base URL [env: TIDINGS_URL].",
)
@click.option(
    "--namespace",
    "-n",
    envvar="TIDINGS_NAMESPACE",
    default="default",
    show_default=True,
    help="The namespace of the topics [env: TIDINGS_NAMESPACE].",
)
@click.option(
    "--token",
    envvar="TIDINGS_TOKEN",
    default=None,
    callback=lambda ctx, param, value: _check_token(value),
    help="The bearer token, where the server has an auth file [env: TIDINGS_TOKEN].",
)
@click.option(
    "--cacert",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A CA file (or directory) to check an https server's certificate with "
    "[env: TIDINGS_CACERT].",
    envvar="TIDINGS_CACERT",
)
@click.option(
    "--transactions-url",
    envvar="TIDINGS_TRANSACTIONS_URL",
    default=None,
    help="Where the transaction service answers, if not at --url (a server run as "
    "--role messaging and --role transactions) [env: TIDINGS_TRANSACTIONS_URL].",
)
@click.option(
    "--timeout",
    envvar="TIDINGS_TIMEOUT",
    type=_Seconds(min=0, min_open=True),
    default=None,
    help="Seconds to wait for each answer of the server; a request safe to repeat is "
    "tried up to 3 times, and a long poll waits its --wait on top [default: 30] "
    "[env: TIDINGS_TIMEOUT].",
)
@click.pass_context
def main(
    ctx: click.Context,
    url: str,
    namespace: str,
    token: str | None,
    cacert: Path | None,
    transactions_url: str | None,
    timeout: float | None,
) -> None:
    """Tidings: a transactional messaging system."""
    tx_url = None if not transactions_url else _with_scheme(transactions_url, "--transactions-url")
    ctx.obj = _Settings(_with_scheme(url), namespace, token, cacert, tx_url, timeout)


def _check_token(token: str | None) -> str | None:
    """The token as the clients send it (:func:`~tidings.client.base.bearer_token`); one
    they refuse is wrong usage (exit 2)."""
    if token is None:
        return None
    from tidings.client.base import bearer_token  # the client loads only when used

    try:
        token = bearer_token(token)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--token") from None
    _check_text(token, "--token", shown=False)
    return token


def _check_text(value: str | None, option: str, *, shown: bool = True) -> None:
    """A usage error for text that holds bytes no encoding gives back (an argument that
    was not UTF-8): it could not be sent, and failed with a traceback where it was."""
    if value is None:
        return
    try:
        value.encode()
    except UnicodeEncodeError:
        what = f"{value!r} is" if shown else "it is"
        raise click.BadParameter(f"{what} not UTF-8 text", param_hint=option) from None


def _with_scheme(url: str, option: str = "--url") -> str:
    """``host:port`` means ``http://host:port``; anything else that is no http(s) URL
    with a host (and a port in range, if any) is a usage error (one line, exit 2)."""
    given = url
    _check_text(url, option)
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    with contextlib.suppress(ValueError):
        if "@" in urlsplit(url).netloc:
            # The client refuses them too: they went out in the Host header, which the
            # server refused. The message does not repeat the URL, which holds a password.
            raise click.BadParameter(
                "a server URL with credentials (user:password@): the server takes a "
                "bearer token, --token, instead",
                param_hint=option,
            )
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is no number in 0..65535
        # A host name no DNS name can be (an empty or overlong label, a control
        # character) failed at the connection with a traceback.
        (parts.hostname or "").encode("idna")
    except ValueError:  # UnicodeError included
        parts, port = None, None
    if (
        parts is None
        or parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or port == 0
        or any(c <= " " or c == "\x7f" for c in parts.netloc)
    ):
        raise click.BadParameter(
            f"not a server URL: {given!r}; expected HOST:PORT or http(s)://HOST:PORT",
            param_hint=option,
        )
    return url


def _setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--config`` and one option per setting that has a flag, made from the settings
    table; each option is named after its setting, so ``serve`` can pass them on as is."""
    from tidings.server.config import CONFIG_ENV, CONFIG_FLAG, ROLES, SETTINGS

    command = click.option(
        CONFIG_FLAG,
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help=f"A TOML configuration file [env: {CONFIG_ENV}]; flags and TIDINGS_* "
        "variables win over it.",
    )(command)
    types: dict[str, Any] = {
        "int": int,
        "float": float,
        # Paths stay text for load_config to read, as from a variable or the file: a
        # click.Path would turn an empty --data-dir into '.', the current directory.
        "role": click.Choice(ROLES),
    }
    for setting in reversed(SETTINGS):
        if setting.flag is None:
            continue
        command = click.option(
            setting.flag,
            setting.name,
            type=types.get(setting.kind, str),
            metavar="PATH" if setting.kind == "path" else None,
            default=None,
            help=f"{setting.what.replace('`', '')} [default: {setting.shown or 'not set'}].",
        )(command)
    return command


class _ConfigProblem(click.ClickException):
    exit_code = 2  # a usage error: nothing was started


@main.command()
@_setting_options
def serve(config_file: Path | None, **flags: Any) -> None:
    """Run the messaging and transaction services on the embedded store."""
    from tidings.server.config import load_config
    from tidings.server.main import run

    overrides = {name: value for name, value in flags.items() if value is not None}
    try:
        config = load_config(overrides, config_file=config_file)
    except ConfigError as exc:
        raise _ConfigProblem(exc.message) from None
    raise SystemExit(run(config))


@main.group("auth")
def auth_group() -> None:
    """Tokens for the server's auth file (docs/security.md)."""


@auth_group.command("token")
@click.option("--name", default="NAME", show_default=True, help="The principal's name.")
def auth_token(name: str) -> None:
    """Print a new random bearer token, and the auth-file lines that admit it.

    The file keeps only the token's sha-256: give the token to the application and
    the lines to the server's auth file.
    """
    from tidings.server.auth import new_token

    _check_text(name, "--name")
    token, digest = new_token()
    click.echo(f"token: {token}")
    click.echo("")
    click.echo("[[principal]]")
    click.echo(f"name = {_toml_string(name)}")
    click.echo(f'token_sha256 = "{digest}"')
    click.echo("admin = false")
    click.echo("publish = []")
    click.echo("consume = []")
    click.echo("transactional_ids = []")
    # Left out, these mean every group (queue) of the topics it may consume; an empty
    # list would mean none, so the template offers them commented out.
    click.echo('# groups = ["NAME-*"]')
    click.echo('# queues = ["NAME-*"]')


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters
    escaped, so that any name gives lines the server's auth file reads back."""
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@main.group("config")
def config_group() -> None:
    """The server's configuration file."""


@config_group.command("example")
def config_example() -> None:
    """Print a reference TOML file: every setting at its default, with what it does."""
    from tidings.server.config import example_toml

    click.echo(example_toml(), nl=False)


# --- helpers ------------------------------------------------------------------------


def _settings(ctx: click.Context) -> _Settings:
    settings = ctx.find_object(_Settings)
    assert settings is not None, "main() sets the settings"
    return settings


class _LogLines(logging.Handler):
    """The client's warnings (a following consumer's outage) as one line each on
    whatever stderr is now: the error they name may come from the server with line
    breaks in it, or escapes for the terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(_escape_controls(self.format(record)), err=True)
        except Exception:
            self.handleError(record)


def _log_lines() -> None:
    logger = logging.getLogger("tidings.client")
    if not any(isinstance(handler, _LogLines) for handler in logger.handlers):
        handler = _LogLines(logging.WARNING)
        logger.addHandler(handler)


def _client(ctx: click.Context) -> Client:
    from tidings.client import Client

    _log_lines()
    settings = _settings(ctx)
    verify: bool | str = True if settings.cacert is None else str(settings.cacert)
    extra: dict[str, Any] = {} if settings.timeout is None else {"timeout": settings.timeout}
    try:
        client = Client(
            settings.url,
            settings.namespace,
            token=settings.token,
            verify=verify,
            transactions_url=settings.transactions_url,
            **extra,
        )
    except ValueError as exc:  # a URL the client cannot use that our checks let by
        raise click.UsageError(str(exc)) from None
    ctx.call_on_close(client.close)
    return client


def _pairs(values: Iterable[str], what: str, *, raw_values: bool = False) -> dict[str, str]:
    """NAME=VALUE items; names (and values, unless ``raw_values``: the caller takes their
    bytes with :func:`os.fsencode`) must be UTF-8 text."""
    out: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint=what)
        _check_text(name, what)
        if not raw_values:
            _check_text(value, what)
        out[name] = value
    return out


def _emit_json(value: object) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def _console() -> Console:
    from rich.console import Console

    class _Quiet(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 here; a reader that stops early (``tidings stats t | head``)
            # is no error: the root group ends quietly with 0, as for click's output.
            self.quiet = True
            raise BrokenPipeError

    return _Quiet(soft_wrap=True)


def _progress(total: int | None, description: str) -> Progress:
    """A progress bar on stderr, shown only when stderr is a terminal and stdout is not
    (so it never mixes with the data a command prints)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    interactive = sys.stderr.isatty() and not sys.stdout.isatty()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    progress = Progress(
        *columns,
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not interactive,
        transient=False,
    )
    progress.add_task(description, total=total)
    return progress


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


# --- topics -------------------------------------------------------------------------


@main.group()
def topics() -> None:
    """Create, list, describe, update and delete topics."""


_ttl_option = click.option("--ttl", type=click.IntRange(1, MAX_TTL), help="Retention in seconds.")
_property_option = click.option(
    "--property", "-p", "props", multiple=True, metavar="NAME=VALUE", help="A topic property."
)


def _properties(props: tuple[str, ...], ttl: int | None) -> dict[str, str]:
    """The -p NAME=VALUE items; a property given twice with two values, or a ttl
    given by --ttl and -p ttl= with two, is wrong usage (one of them was silently
    dropped)."""
    out = _pairs(props, "--property")
    seen: dict[str, str] = {}
    for item in props:
        name, _, value = item.partition("=")
        if seen.setdefault(name, value) != value:
            raise click.BadParameter(
                f"{name!r} is given twice, as {seen[name]!r} and {value!r}",
                param_hint="--property",
            )
    given = out.get("ttl")
    if ttl is not None and given is not None and given.strip() != str(ttl):
        raise click.BadParameter(
            f"the ttl is given twice: --ttl {ttl} and -p ttl={given}", param_hint="--ttl"
        )
    return out


@topics.command("create")
@click.argument("topic")
@_ttl_option
@_property_option
@click.pass_context
def topics_create(ctx: click.Context, topic: str, ttl: int | None, props: tuple[str, ...]) -> None:
    """Create TOPIC."""
    properties = _properties(props, ttl)
    meta = _client(ctx).create_topic(topic, ttl=ttl, properties=properties)
    click.echo(f"created topic {meta.name} (ttl {meta.ttl}s, generation {meta.generation})")


@topics.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also Tidings' own topics.")
@click.pass_context
def topics_list(ctx: click.Context, show_all: bool) -> None:
    """List the namespace's topics, one per line (the Spark sinks' control topics,
    ``__tidings_*``, only with --all)."""
    for name in _client(ctx).list_topics():
        if show_all or not name.startswith(INTERNAL_PREFIX):
            click.echo(name)


@topics.command("describe")
@click.argument("topic")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def topics_describe(ctx: click.Context, topic: str, as_json: bool) -> None:
    """Show TOPIC's properties and generation."""
    meta = _client(ctx).get_topic(topic)
    if as_json:
        _emit_json(
            {
                "namespace": meta.namespace,
                "name": meta.name,
                "generation": meta.generation,
                "ttl": meta.ttl,
                "properties": dict(meta.properties),
            }
        )
        return
    click.echo(f"topic       {meta.namespace}/{meta.name}")
    click.echo(f"generation  {meta.generation}")
    click.echo(f"ttl         {meta.ttl}s")
    for name, value in sorted(meta.properties.items()):
        if name != "ttl":
            click.echo(f"{name:<11} {value}")


@topics.command("update")
@click.argument("topic")
@_ttl_option
@_property_option
@click.pass_context
def topics_update(ctx: click.Context, topic: str, ttl: int | None, props: tuple[str, ...]) -> None:
    """Replace ALL of TOPIC's properties (unset ones return to their defaults)."""
    properties = _properties(props, ttl)
    meta = _client(ctx).update_topic(topic, ttl=ttl, properties=properties)
    click.echo(f"updated topic {meta.name} (ttl {meta.ttl}s)")


@topics.command("delete")
@click.argument("topic")
@click.pass_context
def topics_delete(ctx: click.Context, topic: str) -> None:
    """Delete TOPIC and its messages."""
    _client(ctx).delete_topic(topic)
    click.echo(f"deleted topic {topic}")


# --- publish ------------------------------------------------------------------------


#: Seconds a line of stdin waits for more to join its request (publish --linger).
DEFAULT_LINGER = 0.1
_END = object()


def _read_chunks(stream: IO[bytes], chunks: _queue.Queue[object]) -> None:
    """Put ``stream``'s lines on ``chunks`` a list at a time, as they arrive (what one
    read gives: up to 64 KiB of a file or a fast pipe, one line of a slow one), then
    ``_END``; an error of the read goes on it before ``_END``."""
    read: Callable[[int], bytes]
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a file (a test's in-memory input)
        read = getattr(stream, "read1", None) or stream.read
    else:
        # The file descriptor, not the buffered stream: this thread may still wait in
        # a read when the command ends (Ctrl-C), and one waiting inside the stream
        # holds its lock, which the interpreter's exit then aborts on.
        def read(size: int) -> bytes:
            return os.read(fd, size)

    tail: list[bytes] = []
    try:
        while data := read(1 << 16):
            if b"\n" not in data:
                tail.append(data)  # a long line: joined once it ends
                continue
            lines = data.split(b"\n")
            if tail:
                lines[0] = b"".join(tail) + lines[0]
                tail = []
            last = lines.pop()
            if last:
                tail.append(last)
            chunks.put(lines)
        if tail:
            chunks.put([b"".join(tail)])
    except BaseException as exc:  # handed to the publishing thread, which raises it
        chunks.put(exc)
    finally:
        chunks.put(_END)


def _stdin_batches(
    stream: IO[bytes], size: int, weight: Callable[[bytes], int], linger: float
) -> Iterator[list[bytes]]:
    """The lines of ``stream`` in batches as :func:`_batches` makes them, except that a
    batch also goes once its first line has waited ``linger`` seconds for more (0:
    as soon as nothing more has been read): a slow stream (``tail -f log``) is
    published line by line as it comes, not held back until 500 lines or its end,
    while a file or a fast pipe, read faster than it is published, fills whole
    batches (as Kafka's console producer lingers)."""
    chunks: _queue.Queue[object] = _queue.Queue(maxsize=64)
    reader = threading.Thread(
        target=_read_chunks, args=(stream, chunks), name="tidings-stdin", daemon=True
    )
    reader.start()
    batch: list[bytes] = []
    total = 0
    deadline = 0.0
    while True:
        try:
            if not batch:
                item = chunks.get()
            else:
                item = chunks.get(timeout=max(0.0, deadline - time.monotonic()))
        except _queue.Empty:
            yield batch
            batch, total = [], 0
            continue
        if item is _END:
            if batch:
                yield batch
            return
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, list)
        for line in item:
            w = weight(line)
            if batch and total + w > BATCH_BYTES:
                yield batch
                batch, total = [], 0
            if not batch:
                deadline = time.monotonic() + linger
            batch.append(line)
            total += w
            if len(batch) >= size:
                yield batch
                batch, total = [], 0


#: Bytes of payload per publish request, well below the server's default body limit.
BATCH_BYTES = 4 << 20
#: Topics of Tidings' own (the Spark sinks' control topics): hidden by `topics list`.
INTERNAL_PREFIX = "__tidings_"


def _batches(
    items: Iterable[_T], size: int, weight: Callable[[_T], int] = lambda _: 0
) -> Iterator[list[_T]]:
    """``items`` in lists of at most ``size``, and of at most :data:`BATCH_BYTES` by
    ``weight`` (an item heavier than that goes alone)."""
    batch: list[_T] = []
    total = 0
    for item in items:
        w = weight(item)
        if batch and total + w > BATCH_BYTES:
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += w
        if len(batch) >= size:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


@main.command()
@click.argument("topic")
@click.argument("messages", nargs=-1)
@click.option("--tx", is_flag=True, help="Publish all messages in one transaction.")
@click.option("--key", "-k", help="The message key of every message.")
@click.option(
    "--header", "-H", "headers", multiple=True, metavar="NAME=VALUE", help="A message header."
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
    help="Messages per request (and at most 4 MiB of them).",
)  # fmt: skip
@click.option(
    "--linger", type=_Seconds(min=0), default=DEFAULT_LINGER, show_default=True,
    help="Seconds a line of stdin waits for more lines to join its request (0: none).",
)  # fmt: skip
@click.pass_context
def publish(
    ctx: click.Context,
    topic: str,
    messages: tuple[str, ...],
    tx: bool,
    key: str | None,
    headers: tuple[str, ...],
    batch_size: int,
    linger: float,
) -> None:
    """Publish MESSAGES (or, without any, each line of stdin) to TOPIC.

    Returns once every message is durable; with --tx, once the transaction committed.
    """
    # Arguments as the bytes the shell passed (os.fsencode undoes Python's decoding):
    # one that is no UTF-8 is published as it is, as a line of stdin would be.
    header_map = {
        k: os.fsencode(v) for k, v in _pairs(headers, "--header", raw_values=True).items()
    }
    raw_key = None if key is None else os.fsencode(key)
    key_bytes = len(raw_key or b"")
    payload_batches: Iterable[list[bytes]]
    if messages:
        payload_batches = _batches(
            [os.fsencode(m) for m in messages], batch_size, lambda p: len(p) + key_bytes
        )
    else:
        payload_batches = _stdin_batches(
            sys.stdin.buffer, batch_size, lambda p: len(p) + key_bytes, linger
        )
    batches = ([Record(p, raw_key, header_map) for p in b] for b in payload_batches)
    client = _client(ctx)
    count = 0
    if tx:
        with _progress(len(messages) or None, f"publishing to {topic}") as progress:
            task = progress.task_ids[0]
            with client.transaction() as transaction:
                for batch in batches:
                    transaction.publish(topic, batch)
                    count += len(batch)
                    progress.advance(task, len(batch))
        click.echo(f"published {count} message(s) to {topic} in transaction "
                   f"{transaction.write_pointer}")  # fmt: skip
        return
    try:
        with _progress(len(messages) or None, f"publishing to {topic}") as progress:
            task = progress.task_ids[0]
            for batch in batches:
                client.publish(topic, batch)
                count += len(batch)
                progress.advance(task, len(batch))
    except (TidingsError, KeyboardInterrupt) as exc:
        # Those are durable: whoever runs the input again publishes them twice. (Ctrl-C
        # may end the input too, and then land anywhere up to here.)
        if count:
            why = "the error below" if isinstance(exc, TidingsError) else "the interrupt"
            click.echo(f"{count} message(s) were published to {topic} before {why}", err=True)
        raise
    click.echo(f"published {count} message(s) to {topic}")


# --- consume ------------------------------------------------------------------------


def _bytes_field(out: dict[str, Any], name: str, raw: bytes | None) -> None:
    if raw is None:
        out[name] = None
        return
    try:
        out[name] = raw.decode("utf-8")
    except UnicodeDecodeError:
        out[name + "_base64"] = base64.b64encode(raw).decode("ascii")


def _message_json(message: Message) -> bytes:
    out: dict[str, Any] = {"id": message.id.hex, "time": message.publish_time}
    _bytes_field(out, "key", message.key)
    out["headers"] = {k: _text(v) for k, v in message.headers.items()}
    _bytes_field(out, "payload", message.payload)
    return orjson.dumps(out)


_WHERE = (
    "earliest (or beginning), latest (or end), a message id (40 hex), a time in ms since "
    "the epoch, an ISO-8601 time such as 2026-11-24T10:00, or a time before now such as "
    "-10m (s, m, h, d)"
)


def _position(value: str, param_hint: str) -> MessageId | int | str | None:
    """``value`` as a position: None (the oldest message), ``"latest"``, a message id
    or ms since the epoch; a usage error (exit 2) if it is none of those."""
    from tidings.client.base import resolve_start

    try:
        return resolve_start(value)
    except TidingsError:
        raise click.BadParameter(f"{value!r} is not {_WHERE}", param_hint=param_hint) from None


def _check_start(ctx: click.Context, param: click.Parameter, value: str) -> str:
    _position(value, "--from")
    return value  # the consumer resolves it again, itself


@main.command()
@click.argument("topic")
@click.option(
    "--from", "start", default="beginning", show_default=True, metavar="WHERE",
    callback=_check_start,
    help=f"Where to start: {_WHERE}.",
)  # fmt: skip
@click.option(
    "--follow", "-f", is_flag=True,
    help="Keep waiting for new messages (through server restarts too).",
)  # fmt: skip
@click.option(
    "--uncommitted", is_flag=True,
    help="Read uncommitted (and rolled-back) messages too, without a transaction.",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="text: the payload per line; json: one JSON object per message.",
)  # fmt: skip
@click.option("--limit", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option(
    "--max-bytes", type=click.IntRange(1, INT64_MAX), metavar="BYTES",
    help="Bytes of messages per poll (default and most: the server's fetch_max_bytes).",
)  # fmt: skip
@click.pass_context
def consume(
    ctx: click.Context,
    topic: str,
    start: str,
    follow: bool,
    uncommitted: bool,
    fmt: str,
    limit: int | None,
    max_bytes: int | None,
) -> None:
    """Print TOPIC's messages in order, like kcat -C.

    Read-committed by default: only messages of committed transactions (and
    non-transactional ones). Stops at the end unless --follow.
    """
    client = _client(ctx)
    consumer = client.consume(
        topic,
        start,
        transactional=not uncommitted,
        follow=follow,
        batch_size=min(limit or 1000, 1000),
        max_bytes=max_bytes,
    )
    out = sys.stdout.buffer
    count = 0
    with _progress(limit, f"consuming {topic}") as progress:
        task = progress.task_ids[0]
        try:
            for message in consumer:
                line = message.payload if fmt == "text" else _message_json(message)
                out.write(line + b"\n")
                if follow:
                    out.flush()
                count += 1
                progress.advance(task)
                if limit is not None and count >= limit:
                    break
        except KeyboardInterrupt:
            pass
        out.flush()


# --- stats --------------------------------------------------------------------------


@main.command()
@click.argument("topic")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, topic: str, as_json: bool) -> None:
    """Show TOPIC's contents and traffic."""
    s = _client(ctx).stats(topic)
    rows: list[tuple[str, Any]] = [
        ("messages", s.message_count),
        ("bytes", s.bytes),
        ("oldest id", s.oldest_id.hex if s.oldest_id else None),
        ("newest id", s.newest_id.hex if s.newest_id else None),
        ("oldest time", s.oldest_time),
        ("newest time", s.newest_time),
        ("messages published", s.messages_published),
        ("bytes published", s.bytes_published),
        ("fetches", s.fetches),
        ("publish rate /s", s.publish_rate),
        ("fetch rate /s", s.fetch_rate),
        # "-": the group starts at latest and committed nothing (no place to count from).
        *((f"lag of group {g}", lag) for g, lag in sorted(s.group_lags.items())),
    ]
    if as_json:
        from tidings.codec.admin import stats_json

        _emit_json(stats_json(s))  # the REST API's own spelling (camelCase)
        return
    from rich.table import Table

    table = Table(title=f"{s.namespace}/{s.topic}", show_header=False)
    for name, value in rows:
        shown = _time(value) if name.endswith("time") else value
        if isinstance(shown, float):
            shown = f"{shown:.2f}"
        table.add_row(name, "-" if shown is None else str(shown))
    _console().print(table)


# --- cluster ------------------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
@click.pass_context
def cluster(ctx: click.Context, as_json: bool) -> None:
    """Show the instances sharing the server's store: which leads (and owns every
    topic, the transaction log, groups and queues), its epoch and lease, and which
    stand by."""
    view = _client(ctx).cluster()
    if as_json:
        _emit_json(view)
        return
    from rich.table import Table

    leader = view.get("leader") or {}
    epoch = leader.get("epoch")
    title = f"store: {view.get('store')}"
    if epoch is not None:
        expires = leader.get("expiresInMs", 0) / 1000
        age = leader.get("leaseAgeMs", 0) / 1000
        title += f", leader epoch {epoch}, lease held {age:.1f} s, renews within {expires:.1f} s"
    table = Table(title=title)
    instances = view.get("instances", [])
    # A URL keeps one line where the width allows, else folds: never ends in "…".
    longest_url = max((len(str(info.get("url"))) for info in instances), default=3)
    for column in ("instance", "url", "role", "owns", "last heard"):
        width = min(longest_url, 60) if column == "url" else None
        table.add_column(column, overflow="fold", min_width=width)
    for info in instances:
        seen = info.get("seenAgoMs")
        table.add_row(
            str(info.get("id")),
            str(info.get("url")),
            "leader" if info.get("leader") else "standing by",
            ", ".join(info.get("owns", [])) or "-",
            "-" if seen is None else f"{seen / 1000:.1f} s ago",
        )
    _console().print(table)


# --- consumer groups ----------------------------------------------------------------


@main.group()
def groups() -> None:
    """List, describe, reset and delete a topic's consumer groups."""


@groups.command("list")
@click.argument("topic")
@click.pass_context
def groups_list(ctx: click.Context, topic: str) -> None:
    """The names of TOPIC's consumer groups."""
    for name in _client(ctx).groups(topic):
        click.echo(name)


@groups.command("describe")
@click.argument("topic")
@click.argument("group")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def groups_describe(ctx: click.Context, topic: str, group: str, as_json: bool) -> None:
    """GROUP's members and, per partition, owner, committed position and lag."""
    from tidings.codec.admin import group_json

    info = _client(ctx).describe_group(topic, group)
    if as_json:
        _emit_json(group_json(info))
        return
    from rich.table import Table

    total = "-" if info.lag is None else str(info.lag)
    if info.lag is not None and not all(p.lag_exact for p in info.partitions):
        total += "+"
    unknown = sum(p.lag is None for p in info.partitions)
    if unknown and info.lag is not None:
        # Kafka's tool shows "-" for these: the total leaves them out.
        total += f" ({unknown} partition(s) with no committed position not counted)"
    table = Table(
        title=f"{topic}/{group}: generation {info.generation}, {len(info.members)} member(s), "
        f"lag {total}"
    )
    # Ids fold onto a second line rather than end in "…": a position is what
    # `groups reset --to` takes, so it must be there to copy; it keeps one line where
    # the width allows.
    for column in ("partition", "owner", "position", "lag"):
        table.add_column(
            column,
            justify="right" if column in ("partition", "lag") else "left",
            overflow="fold",
            min_width=40 if column == "position" else None,
        )
    for p in info.partitions:
        table.add_row(
            str(p.partition),
            p.owner or "-",
            p.position.hex if p.position else "-",
            "-" if p.lag is None else f"{p.lag}{'' if p.lag_exact else '+'}",
        )
    _console().print(table)


def _reset_target(value: str) -> str | MessageId | int:
    """Where ``groups reset --to`` moves a group: the words and times ``--from`` takes."""
    position = _position(value, "--to")
    return "earliest" if position is None else position


@groups.command("reset")
@click.argument("topic")
@click.argument("group")
@click.option(
    "--to", "to", required=True, metavar="WHERE",
    help=f"Where to: {_WHERE}. After a message id it resumes with the next message.",
)  # fmt: skip
@click.pass_context
def groups_reset(ctx: click.Context, topic: str, group: str, to: str) -> None:
    """Move every position of GROUP (which must have no members)."""
    _client(ctx).reset_group(topic, group, _reset_target(to))
    click.echo(f"reset group {group} of {topic} to {to}")


@groups.command("delete")
@click.argument("topic")
@click.argument("group")
@click.pass_context
def groups_delete(ctx: click.Context, topic: str, group: str) -> None:
    """Delete GROUP and its positions."""
    _client(ctx).delete_group(topic, group)
    click.echo(f"deleted group {group} of {topic}")


# --- queues -------------------------------------------------------------------------


@main.group()
def queues() -> None:
    """List queues, show a queue's statistics, purge a queue."""


@queues.command("list")
@click.argument("topic", required=False)
@click.pass_context
def queues_list(ctx: click.Context, topic: str | None) -> None:
    """Every queue of the namespace (TOPIC QUEUE per line), or TOPIC's."""
    for topic_name, queue in _client(ctx).queues(topic):
        click.echo(f"{topic_name} {queue}")


@queues.command("stats")
@click.argument("topic")
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def queues_stats(ctx: click.Context, topic: str, queue: str, as_json: bool) -> None:
    """QUEUE's depth, messages in flight, workers and counters."""
    from tidings.codec.queue_bodies import queue_json

    s = _client(ctx).describe_queue(topic, queue)
    if as_json:
        _emit_json(queue_json(s))
        return
    from rich.table import Table

    rows: list[tuple[str, object]] = [
        ("waiting (depth)", f"{s.waiting}{'' if s.waiting_exact else '+'}"),
        ("pending (leased)", s.pending),
        ("workers", ", ".join(f"{c}: {n}" for c, n in sorted(s.consumers.items())) or "-"),
        ("pushed", s.pushed),
        ("popped", s.popped),
        ("acked", s.acked),
        ("nacked", s.nacked),
        ("redelivered", s.redelivered),
        ("expired leases", s.expired),
        ("dead-lettered", s.dead_lettered),
        ("pop rate /s", f"{s.pop_rate:.2f}"),
        ("ack rate /s", f"{s.ack_rate:.2f}"),
        ("max deliveries", s.max_deliveries),
        ("dead-letter topic", s.dead_letter_topic),
        ("cursor", s.cursor.hex if s.cursor else "-"),
        ("read position", s.read.hex if s.read else "-"),
    ]
    table = Table(title=f"{topic}/{queue}", show_header=False)
    for name, value in rows:
        table.add_row(name, str(value))
    _console().print(table)


@queues.command("purge")
@click.argument("topic")
@click.argument("queue")
@click.pass_context
def queues_purge(ctx: click.Context, topic: str, queue: str) -> None:
    """Ack everything QUEUE holds and everything published to TOPIC so far."""
    dropped = _client(ctx).purge_queue(topic, queue)
    click.echo(f"purged queue {queue} of {topic} ({dropped} read and not acked dropped)")


@queues.command("delete")
@click.argument("topic")
@click.argument("queue")
@click.pass_context
def queues_delete(ctx: click.Context, topic: str, queue: str) -> None:
    """Delete QUEUE and its state."""
    _client(ctx).delete_queue(topic, queue)
    click.echo(f"deleted queue {queue} of {topic}")


@main.command()
@click.argument("topic")
@click.option("--group", "-g", required=True, help="The queue (a named group of TOPIC).")
@click.option("--count", "-n", type=click.IntRange(1, INT64_MAX), default=1, show_default=True)
@click.option("--ack", is_flag=True, help="Ack what was popped (else it goes back at exit).")
@click.option("--wait", type=_Seconds(min=0), default=0, show_default=True,
              help="Seconds to wait for a message when none is available.")  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="text: the payload per line; json: one JSON object per message.",
)  # fmt: skip
@click.pass_context
def pop(
    ctx: click.Context, topic: str, group: str, count: int, ack: bool, wait: float, fmt: str
) -> None:
    """Pop up to COUNT messages from queue GROUP of TOPIC and print them.

    Without --ack the messages go back to the queue when the command ends (a nack),
    so trying a queue by hand takes nothing from its workers.
    """
    client = _client(ctx)
    with client.queue(topic, group) as q:
        try:
            messages = q.pop(count, wait=wait)
        except TidingsError:
            # The pop's error is the one to show: the release on leaving the block,
            # failing too (no server there), would put its own in its place.
            with contextlib.suppress(TidingsError):
                q.close()
            raise
        out = sys.stdout.buffer
        for message in messages:
            if fmt == "text":
                out.write(message.payload + b"\n")
            else:
                line = orjson.loads(_message_json(message))
                line["deliveryCount"] = message.delivery_count
                out.write(orjson.dumps(line) + b"\n")
        out.flush()
        if ack and messages:
            q.ack(messages)


# --- transactions -------------------------------------------------------------------

#: A write pointer on the command line: what the server can name (a usage error else).
_WRITE_POINTER = click.IntRange(1, INT64_MAX)


@main.group("tx")
def tx_group() -> None:
    """List, abort, invalidate transactions; prune the invalid list."""


@tx_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def tx_list(ctx: click.Context, as_json: bool) -> None:
    """Show the read pointer, transactions in progress and the invalid list."""
    state = _client(ctx).transactions()
    if as_json:
        _emit_json(
            {
                "readPointer": state.read_pointer,
                "lastWritePointer": state.last_write_pointer,
                "inProgress": [
                    {"writePointer": wp, "expiresAt": exp} for wp, exp in state.in_progress.items()
                ],
                "invalid": list(state.invalid),
            }
        )
        return
    click.echo(f"read pointer        {state.read_pointer}")
    click.echo(f"last write pointer  {state.last_write_pointer}")
    click.echo(f"in progress         {len(state.in_progress)}")
    for wp, expires in state.in_progress.items():
        click.echo(f"  {wp}  expires {_time(expires)}")
    click.echo(f"invalid             {len(state.invalid)}")
    for wp in state.invalid:
        click.echo(f"  {wp}")


@tx_group.command("abort")
@click.argument("write_pointer", type=_WRITE_POINTER)
@click.pass_context
def tx_abort(ctx: click.Context, write_pointer: int) -> None:
    """Abort a transaction (its published entries must have been rolled back).

    Exits 1 if it was not aborted: unknown, committed, or invalid already (timed out,
    invalidated, fenced), which the server accepts without changing anything.
    """
    end = _client(ctx).abort(write_pointer)
    if end.aborted:
        if end.already:
            click.echo(f"transaction {write_pointer} was already aborted")
        else:
            click.echo(f"aborted transaction {write_pointer}")
        return
    error = TransactionTimedOut if end.outcome == "timedOut" else TransactionInvalid
    raise error(
        f"transaction {write_pointer} was not aborted: {_why_invalid(end.outcome)}, "
        "so its writes never show"
    )


@tx_group.command("invalidate")
@click.argument("write_pointer", type=_WRITE_POINTER)
@click.pass_context
def tx_invalidate(ctx: click.Context, write_pointer: int) -> None:
    """Invalidate a transaction: its writes are never visible."""
    end = _client(ctx).invalidate(write_pointer)
    if end.already:
        click.echo(f"transaction {write_pointer} was already invalid: {_why_invalid(end.outcome)}")
    else:
        click.echo(f"invalidated transaction {write_pointer}")


def _why_invalid(outcome: str) -> str:
    """How a transaction became invalid, from the outcome an abort or invalidate names."""
    return {
        "timedOut": "it timed out",
        "invalidated": "it was invalidated",
        "fenced": "it was invalidated when its transactional id was registered again",
        "unlogged": "it was invalidated because the transaction service stopped "
        "before its begin was durable",
    }.get(outcome, f"it ended as {outcome!r}")


@tx_group.command("prune")
@click.option(
    "--below", type=click.IntRange(0, INT64_MAX), help="Drop every invalid pointer below this one."
)
@click.argument("write_pointers", nargs=-1, type=_WRITE_POINTER)
@click.pass_context
def tx_prune(ctx: click.Context, below: int | None, write_pointers: tuple[int, ...]) -> None:
    """Drop pointers from the invalid list once no stored entry refers to them.

    Name them (WRITE_POINTERS) and/or give --below; prints what was dropped, and the
    named pointers that were not on the invalid list.
    """
    if below is None and not write_pointers:
        raise click.UsageError("name write pointers and/or give --below")
    pruned = _client(ctx).prune(below=below, ids=write_pointers)
    click.echo(f"pruned {len(pruned)} invalid pointer{'' if len(pruned) == 1 else 's'}")
    for wp in pruned:
        click.echo(f"  {wp}")
    # A pointer named but not dropped was not invalid (in progress, ended otherwise,
    # unknown, or pruned already): say so rather than let a mistyped one pass unseen.
    kept = sorted(set(write_pointers).difference(pruned))
    if kept:
        click.echo(f"not on the invalid list: {' '.join(map(str, kept))}")


# --- inspect ------------------------------------------------------------------------


@main.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--topic", "-t", help="Show this topic's raw Message Table entries.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True,
    help="At most this many entries.",
)  # fmt: skip
@click.option("--payloads", is_flag=True, help="Also list the Payload Table rows of entries.")
@click.pass_context
def inspect(
    ctx: click.Context, data_dir: Path, topic: str | None, limit: int, payloads: bool
) -> None:
    """Look inside DATA_DIR's store, read-only (safe while the server runs).

    Without --topic: every table's row count and every topic. With --topic: that topic's
    raw entries in order, with their write pointers (negative: rolled back).
    """
    import lmdb

    from tidings.store.backends.lmdb import LmdbStore

    path = data_dir if (data_dir / "data.mdb").exists() else data_dir / "store"
    try:
        store = LmdbStore(path, readonly=True)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    except (lmdb.Error, OSError) as exc:
        raise click.ClickException(f"not a readable LMDB store: {exc}") from None
    settings = _settings(ctx)
    try:
        with store.read() as view:
            if topic is None:
                _inspect_store(view, path)
            else:
                _inspect_topic(view, settings.namespace, topic, limit, payloads)
    except lmdb.Error as exc:
        raise click.ClickException(f"cannot read the store: {exc}") from None
    finally:
        store.close()


# --- backup -------------------------------------------------------------------------


@main.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def backup(data_dir: Path, dest: Path) -> None:
    """Copy DATA_DIR (store/ and tx/) into DEST, consistently, while the server runs.

    DEST must not exist or be empty. Restore by starting a server on a directory
    holding DEST's store/ and tx/. See docs/operations.md.
    """
    store_dir, tx_dir = data_dir / "store", data_dir / "tx"
    try:
        if dest.exists() and any(dest.iterdir()):
            raise _UsageProblem(f"{dest} is not empty: give a new or empty directory")
        if not (store_dir / "data.mdb").exists() and not tx_dir.is_dir():
            raise click.ClickException(f"{data_dir} holds no store/ and no tx/ to back up")
        from tidings.backup import copy_data_dir

        logs, dropped = copy_data_dir(store_dir, tx_dir, dest)
    except BackupFailed as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:
        raise click.ClickException(f"cannot back up {data_dir} to {dest}: {exc}") from None
    generations = ", ".join(str(g) for g in sorted(logs)) or "none"
    click.echo(f"backed up {data_dir} to {dest} (transaction log generations: {generations})")
    if dropped:
        click.echo(f"left out {dropped} transaction log record(s) written after the log was copied")


def _inspect_store(view: ReadView, path: Path) -> None:
    from rich.table import Table

    from tidings.codec import keys, values
    from tidings.store.backend import AFTER_ALL_KEYS, TABLES

    console = _console()
    counts = Table(title=f"tables in {path}")
    counts.add_column("table")
    counts.add_column("rows", justify="right")
    with _progress(len(TABLES), "counting rows") as progress:
        for table in TABLES:
            counts.add_row(table, f"{_count(view, table, b'', AFTER_ALL_KEYS):,}")
            progress.advance(progress.task_ids[0])
    console.print(counts)

    start, stop = keys.TOPIC_PREFIX, keys.TOPIC_PREFIX + b"\xff"
    records = list(view.scan("metadata", start, stop))
    listing = Table(title="topics")
    # Names whole (folded over lines past the width, never cut with an ellipsis): a name
    # is what the next command takes. Up to 24 characters they keep one line in 80
    # columns, the number columns giving way instead.
    longest = max((len(key) - len(keys.TOPIC_PREFIX) for key, _ in records), default=0)
    listing.add_column("namespace/topic", min_width=min(longest, 24), overflow="fold")
    # Figures fold as well: one cut short with "…" reads as another number.
    for column in ("id", "generation", "ttl s", "entries", "payload rows"):
        listing.add_column(column, justify="right", overflow="fold")
    for key, value in records:
        name = key[len(keys.TOPIC_PREFIX) :].decode("ascii", "replace")
        topic_id, _ = values.decode_topic_record(value)
        raw_state = view.get("metadata", keys.state_key(topic_id))
        if raw_state is None:
            listing.add_row(name, str(topic_id), "?", "?", "?", "?")
            continue
        state = values.decode_state(raw_state)
        entries = rows = "-"
        if state.generation > 0:
            lo, hi = keys.generation_range(topic_id, state.generation)
            entries = f"{_count(view, 'messages', lo, hi):,}"
            rows = f"{_count(view, 'payloads', lo, hi):,}"
        generation = str(state.generation) + (" (deleted)" if state.generation < 0 else "")
        listing.add_row(name, str(topic_id), generation, str(state.ttl), entries, rows)
    console.print(listing)


#: Sorts after every key (LMDB keys are at most 511 bytes).


def _count(view: ReadView, table: str, start: bytes, stop: bytes) -> int:
    return sum(1 for _ in view.scan(table, start, stop))


def _inspect_topic(
    view: ReadView, namespace: str, topic: str, limit: int, show_payloads: bool
) -> None:

    from tidings.codec import keys, values

    record = view.get("metadata", keys.topic_record_key(namespace, topic))
    if record is None:
        raise click.ClickException(f"no topic {namespace}/{topic} in this store")
    topic_id, properties = values.decode_topic_record(record)
    raw_state = view.get("metadata", keys.state_key(topic_id))
    if raw_state is None:
        raise click.ClickException(f"topic {namespace}/{topic} has no state record")
    state = values.decode_state(raw_state)
    # Plain text: property names and values are the user's, and brackets in them are
    # no markup (rich would drop them, or fail on a closing tag without an opening one).
    click.echo(
        f"topic {namespace}/{topic}: id {topic_id}, generation {state.generation}, "
        f"ttl {state.ttl}s, last key ({state.last_ts}, {state.last_seq}), "
        f"properties {properties}"
    )
    if state.generation < 0:
        click.echo("the topic is deleted")
        return
    # Plain lines rather than a table: ids and pointers must show in full, and grep.
    click.echo(f"{'publish_ts':<14} {'seq':>5}  {'message id':<40}  {'write pointer':>20}  entry")
    lo, hi = keys.generation_range(topic_id, state.generation)
    for key, value in view.scan("messages", lo, hi, limit):
        _, _, ts, seq = keys.parse_message_key(key)
        if value[0] in values.BATCH_FLAGS:
            _inspect_batch(ts, seq, value)
            continue
        stored = values.decode_value(value)
        wp = stored.write_pointer
        shown_wp = "-" if wp is None else str(wp)
        prefix = f"{ts:<14} {seq:>5}  {keys.message_id_bytes(key).hex()}  {shown_wp:>20}  "
        note = " (rolled back)" if wp is not None and wp < 0 else ""
        if stored.payload is not None:
            extras = "" if stored.key is None else f" key={_text(stored.key)!r}"
            if stored.headers:
                extras += f" headers={sorted(stored.headers)}"
            if stored.expires_at is not None:
                extras += f" expires={stored.expires_at}"
            click.echo(
                f"{prefix}message {len(stored.payload)} B{extras}{note}: {_preview(stored.payload)}"
            )
            continue
        assert wp is not None
        p_lo, p_hi = keys.write_pointer_range(topic_id, state.generation, abs(wp))
        rng = values.read_payload_range(value)
        if rng is not None:
            # A ranged entry stands for only its rows (keys are fixed-width: + b"\0").
            p_hi = p_lo + keys.ts_seq(*rng.last) + b"\0"
            p_lo = p_lo + keys.ts_seq(*rng.first)
        rows = list(view.scan("payloads", p_lo, p_hi))
        shown_range = "" if rng is None else f" in range {rng.first}-{rng.last}"
        click.echo(f"{prefix}pointer to {len(rows)} payload row(s){shown_range}{note}")
        if show_payloads:
            for p_key, p_value in rows:
                payload = values.decode_value(p_value).payload or b""
                click.echo(
                    f"{'':<14} {'':>5}  {keys.message_id_bytes(key, p_key).hex()}  {'':>20}"
                    f"    payload row {len(payload)} B: {_preview(payload)}"
                )


def _inspect_batch(ts: int, seq: int, value: bytes) -> None:
    """A batch entry's line, then one per message it holds (each with its own id)."""
    from tidings.codec import values
    from tidings.structs import MessageId

    count, ends, starts = values.batch_layout(value)
    keyed = bool(value[0] & values.FLAG_KEY)
    skip = values.batch_key_skip(value[0])
    wp = values.read_write_pointer(value)
    shown_wp = "-" if wp is None else str(wp)
    note = " (rolled back)" if wp is not None and wp < 0 else ""
    first = MessageId(ts, seq).hex
    click.echo(f"{ts:<14} {seq:>5}  {first}  {shown_wp:>20}  batch entry of {count} messages{note}")
    for i in range(count):
        # Through the positions, as every reader: a plain message may be its payload
        # alone, without a flags byte of its own.
        payload = value[starts[i] : ends[i + 1]]
        extras = f" key={_text(value[ends[i] + skip : starts[i]])!r}" if keyed else ""
        message_id = MessageId(ts, seq + i).hex
        click.echo(
            f"{'':<14} {seq + i:>5}  {message_id}  {'':>20}"
            f"    message {len(payload)} B{extras}: {_preview(payload)}"
        )


#: Control characters as escapes in a preview: a newline in a payload must not split
#: an entry's line, nor an escape sequence reach the terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def _escape_controls(text: str) -> str:
    return text.translate(_CONTROLS)


def _preview(payload: bytes, width: int = 40) -> str:
    text = _text(payload[:width]).translate(_CONTROLS)
    return text + ("…" if len(payload) > width else "")
