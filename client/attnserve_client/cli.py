"""``attnserve-client``: the service from a shell, with readable output (or ``--json`` for scripts).

    attnserve-client classify shoe.png --top-k 3
    attnserve-client translate "Open the file." --stream
    attnserve-client translate - < sentences.txt --json
    attnserve-client po translate messages.pot -o de.po
    attnserve-client html translate page.html          # writes page.de.html
    attnserve-client models

Exit status: 0 on success, 1 when the service answered an error or could not be reached (the
message, with the request id, goes to stderr), 2 for a usage mistake; ``ready`` exits 1 when not ready.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from attnserve_client import _html
from attnserve_client._sync import Client
from attnserve_client._version import __version__
from attnserve_client.errors import AttnserveError, PayloadTooLargeError
from attnserve_client.po import DEFAULT_BATCH_SIZE
from attnserve_client.types import ClassifyResponse, TokenEvent, TranslateResponse


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with Client(
            base_url=args.base_url, api_key=args.api_key, timeout=args.timeout, max_retries=args.max_retries
        ) as client:
            return args.run(client, args)
    except AttnserveError as e:
        print(f"attnserve-client: error: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # an unreadable image file, a bad ATTNSERVE_* variable
        print(f"attnserve-client: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, e.g. during a stream: the connection is closed on the way out
        return 130


def _common_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--base-url", default=default, help="service URL (default: $ATTNSERVE_BASE_URL or http://127.0.0.1:8000)"
    )
    parser.add_argument("--api-key", default=default, help="sent as a bearer token (default: $ATTNSERVE_API_KEY)")
    parser.add_argument(
        "--timeout", type=float, default=default, help="seconds per attempt (default: $ATTNSERVE_TIMEOUT or 60)"
    )
    parser.add_argument(
        "--max-retries",
        type=int,
        default=default,
        help="retries on connection errors, 429 and 503 (default: $ATTNSERVE_MAX_RETRIES or 2)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if default is None else default,
        help="print the service's answer as JSON",
    )


def _parser() -> argparse.ArgumentParser:
    # The options are accepted before and after the command; after it, only those given override.
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, argparse.SUPPRESS)

    parser = argparse.ArgumentParser(prog="attnserve-client", description="Call an attnserve service.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _common_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str,
        run: Callable[[Client, argparse.Namespace], int],
        help: str,
        under: argparse._SubParsersAction = commands,
    ) -> argparse.ArgumentParser:
        sub = under.add_parser(name, parents=[common], help=help, description=help)
        sub.set_defaults(run=run)
        return sub

    classify = command("classify", _classify, "top-k labels of one or more images")
    classify.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    classify.add_argument("--top-k", type=int, default=5)
    classify.add_argument("--model")

    translate = command("translate", _translate, "translate English text to German")
    translate.add_argument(
        "texts", nargs="+", metavar="TEXT", help="texts to translate; '-' reads one per line from stdin"
    )
    translate.add_argument("--beam-size", type=int, help="1: greedy (default: the model's; greedy with --stream)")
    translate.add_argument("--max-new-tokens", type=int)
    translate.add_argument("--num-return-sequences", type=int, help="n-best list size (at most the beam size)")
    translate.add_argument("--model")
    translate.add_argument("--stream", action="store_true", help="print tokens as they are generated (one text)")
    translate.add_argument(
        "--format",
        choices=["text", "html"],
        default="text",
        help="html: each TEXT is an HTML fragment, its tags kept; '-' reads all of stdin as one (default: text)",
    )
    translate.add_argument(
        "--priority",
        choices=["interactive", "batch"],
        default="interactive",
        help="batch: bulk work, decoded after interactive requests (po translate always sends batch)",
    )

    po = commands.add_parser("po", help="gettext catalogs (.po, .pot)", description="gettext catalogs (.po, .pot)")
    po_commands = po.add_subparsers(dest="po_command", required=True, metavar="COMMAND")
    po_translate = command(
        "translate",
        _po_translate,
        "fill a catalog's untranslated entries with machine translations flagged fuzzy",
        under=po_commands,
    )
    po_translate.add_argument("catalog", type=Path, metavar="IN.po", help="the catalog or template (.po, .pot)")
    po_translate.add_argument(
        "-o", "--output", type=Path, required=True, metavar="OUT.po", help="where to write the result (may be IN.po)"
    )
    po_translate.add_argument("--beam-size", type=int, help="1: greedy (default: the model's)")
    po_translate.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help="texts per request, at most the service's ATTNSERVE_MAX_TEXTS_PER_REQUEST (default: %(default)s)",
    )
    po_translate.add_argument(
        "--language", default="de", help="the target language, written into a template's header (default: %(default)s)"
    )
    po_translate.add_argument("--model")

    html = commands.add_parser("html", help="HTML pages and fragments", description="HTML pages and fragments")
    html_commands = html.add_subparsers(dest="html_command", required=True, metavar="COMMAND")
    html_translate = command(
        "translate",
        _html_translate,
        "translate an HTML page or fragment (UTF-8), keeping its tags, links, scripts, styles and code",
        under=html_commands,
    )
    html_translate.add_argument("file", type=Path, metavar="FILE", help="the page or fragment (.html), UTF-8")
    html_translate.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="OUT",
        help="where to write the translation (default: FILE with .de before its extension: page.de.html; "
        "page.en.html also gives page.de.html)",
    )
    html_translate.add_argument("--beam-size", type=int, help="1: greedy, fastest (default: the model's)")
    html_translate.add_argument("--model")

    attention = command("attention", _attention, "attention maps stored for an earlier request")
    attention.add_argument("id", help="attention_id of a result (classify/translate with return_attention)")
    attention.add_argument("--layer", type=int)
    attention.add_argument("--head", type=int)
    attention.add_argument("--kind")
    attention.add_argument("--png", type=Path, metavar="FILE", help="write the heatmap to FILE instead")

    command("models", _models, "the models the service serves")
    command("health", _health, "liveness")
    command("ready", _ready, "readiness (exit status 1 when not ready)")
    return parser


def _classify(client: Client, args: argparse.Namespace) -> int:
    response = client.classify(args.images, top_k=args.top_k, model=args.model)
    if args.json:
        _print_json(response)
    else:
        _print_classification(args.images, response)
    return 0


def _print_classification(names: Sequence[str], response: ClassifyResponse) -> None:
    width = max(len(s.label) for r in response.results for s in r.top_k)
    for name, result in zip(names, response.results):
        print(name)
        for s in result.top_k:
            print(f"  {s.label:<{width}}  {s.score:6.1%}")


def _translate(client: Client, args: argparse.Namespace) -> int:
    html = args.format == "html"
    if args.texts != ["-"]:
        texts = args.texts
    elif html:  # a document spans lines: stdin is one text
        texts = [sys.stdin.read()]
    else:
        texts = [line.strip() for line in sys.stdin if line.strip()]
    options = {
        "beam_size": args.beam_size,
        "max_new_tokens": args.max_new_tokens,
        "model": args.model,
        "num_return_sequences": args.num_return_sequences,
    }
    if html and args.stream:
        print("attnserve-client: --stream translates plain text only, not --format html", file=sys.stderr)
        return 2
    if not args.stream:
        response = client.translate(texts, **options, format=args.format, priority=args.priority)
        if args.json:
            _print_json(response)
        else:
            _print_translations(response)
        return 0
    if len(texts) != 1:
        print("attnserve-client: --stream translates one text at a time", file=sys.stderr)
        return 2
    printed = False
    with client.translate_stream(texts[0], **options) as stream:
        for event in stream:
            if args.json:
                print(event.model_dump_json(exclude_unset=True), flush=True)
            elif isinstance(event, TokenEvent):
                print(event.delta, end="", flush=True)
                printed = True
            elif not printed:  # beam search sends no token events: the translation comes whole
                print(event.response.results[0].translation, end="")
    if not args.json:
        print()
    return 0


def _print_translations(response: TranslateResponse) -> None:
    for result in response.results:
        print(result.translation)
        for h in result.nbest or []:
            print(f"  {h.normalized_score:8.4f}  {h.translation}")


def _po_translate(client: Client, args: argparse.Namespace) -> int:
    summary = client.translate_po(
        args.catalog,
        output=args.output,
        language=args.language,
        batch_size=args.batch_size,
        beam_size=args.beam_size,
        model=args.model,
    ).summary
    if args.json:
        print(json.dumps({"output": str(args.output), **dataclasses.asdict(summary)}, indent=2))
    else:
        print(f"{args.output}: {summary}")
    return 0


def html_output_path(source: Path) -> Path:
    """Where ``html translate`` writes by default: ``page.html`` -> ``page.de.html``, ``page.en.html`` ->
    ``page.de.html`` (the language suffix of content negotiation replaced), ``page`` -> ``page.de``."""
    stem = source.stem.removesuffix(".en") if source.suffix else source.name
    return source.with_name(f"{stem}.de{source.suffix}")


def _html_translate(client: Client, args: argparse.Namespace) -> int:
    try:  # bytes: the document's own line endings come back as they were
        document = args.file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{args.file}: not UTF-8 (byte {e.start}): convert it first, e.g. with iconv") from e
    output = args.output or html_output_path(args.file)
    parts = _translate_html(client, document, beam_size=args.beam_size, model=args.model)
    text = "".join(parts)
    output.write_bytes(text.encode("utf-8"))
    if args.json:
        print(
            json.dumps(
                {"input": str(args.file), "output": str(output), "characters": len(text), "requests": len(parts)},
                indent=2,
            )
        )
    else:
        sent = "" if len(parts) == 1 else f"; sent in {len(parts)} parts, the service refused it whole"
        print(f"{output}: {len(text)} characters written (from {len(document)} in {args.file}{sent})")
    return 0


def _translate_html(client: Client, document: str, *, beam_size: int | None, model: str | None) -> list[str]:
    """The translation of each part ``document`` was sent in: the whole, or, where the service refuses that as
    too large (its characters, or its sentences at once), halves cut before a block tag, and so on."""
    try:
        return [client.translate(document, beam_size=beam_size, model=model, format="html").results[0].translation]
    except PayloadTooLargeError as e:
        parts = _html.halves(document)
        if parts is None or " tokens long" in e.message:  # one sentence over the limit: no cut shortens it
            raise
        return [t for part in parts for t in _translate_html(client, part, beam_size=beam_size, model=model)]


def _attention(client: Client, args: argparse.Namespace) -> int:
    if args.png:
        args.png.write_bytes(client.attention_png(args.id, layer=args.layer, head=args.head, kind=args.kind))
        print(args.png)
        return 0
    attention = client.attention(args.id, layer=args.layer, head=args.head, kind=args.kind)
    if args.json:
        _print_json(attention)
        return 0
    print(f"{attention.id}: {attention.task}, {attention.model}/{attention.version}, expires {attention.expires_at}")
    for name, m in attention.maps.items():
        print(f"  {name}: {' x '.join(f'{a} {n}' for a, n in zip(m.axes, m.shape))}")
    return 0


def _models(client: Client, args: argparse.Namespace) -> int:
    models = client.models()
    if args.json:
        print("[" + ", ".join(m.model_dump_json(exclude_unset=True) for m in models) + "]")
        return 0
    rows = [
        (m.name, m.version, m.task or "-", m.status, m.provider or "-", "default" if m.default else "") for m in models
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(6)] if rows else []
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _health(client: Client, args: argparse.Namespace) -> int:
    health = client.health()
    print(health.model_dump_json(exclude_unset=True) if args.json else health.status)
    return 0


def _ready(client: Client, args: argparse.Namespace) -> int:
    readiness = client.ready()
    if args.json:
        _print_json(readiness)
    else:
        print("ready" if readiness.ready else f"not ready: {readiness.reason}")
    return 0 if readiness.ready else 1


def _print_json(model: BaseModel) -> None:
    print(model.model_dump_json(indent=2, exclude_unset=True))


if __name__ == "__main__":
    sys.exit(main())
