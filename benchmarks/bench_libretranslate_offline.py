"""LibreTranslate as ``bench_libretranslate`` runs it: offline, on the one Argos package it was given.

Run by the Python of LibreTranslate's own environment (``make libretranslate``), not the project's:
``.venv-libretranslate/bin/python benchmarks/bench_libretranslate_offline.py --host 127.0.0.1 --port N
--load-only en,de ...`` (the arguments are LibreTranslate's own, for its ``main()``); it imports nothing
of the project. It differs from ``libretranslate`` in three ways, each because LibreTranslate would
download something:

- LibreTranslate's boot step is skipped. Whenever fewer than two Argos packages are installed (here:
  the one en->de package the benchmark built) it downloads the package index, the packages it lacks
  and MiniSBD's sentence-splitter models (ten tries each, with doubling pauses: minutes offline).
- argos-translate's sentence splitter returns the text whole. Its default (``ARGOS_CHUNK_TYPE`` unset:
  MiniSBD) runs an ONNX model that it downloads at the first request, since our package ships none.
  No setting avoids that: ``ARGOS_CHUNK_TYPE=NONE`` makes argos skip the package as unsupported, STANZA
  and SPACY need those libraries and their own downloaded models. The benchmark's messages are one
  sentence each, so CTranslate2 is given the same sentences; the splitter's own time per request is
  left out, which favours LibreTranslate.
- Looking up a host name, or connecting to any address but the loopback, raises: a download that
  something still tries fails at once instead of reaching out.

Everything else a request meets is LibreTranslate's, as installed: waitress, Flask, argos-translate
(its tokenizer, its cache of the previous text) and CTranslate2, and LibreTranslate's formatting of the
translation (``improve_translation_formatting``).
"""

from __future__ import annotations

import ipaddress
import socket
import sys

_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo


def _is_loopback(host: object) -> bool:
    if host in ("localhost", None):
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else str(host)).is_loopback
    except ValueError:  # a host name: not looked up
        return False


def _refuse(host: object) -> OSError:
    return ConnectionRefusedError(f"bench_libretranslate keeps LibreTranslate offline: no connection to {host}")


def _connect_loopback(sock: socket.socket, address) -> None:
    if isinstance(address, tuple) and not _is_loopback(address[0]):
        raise _refuse(address[0])
    _connect(sock, address)


def _getaddrinfo_loopback(host, *args, **kwargs):
    if not _is_loopback(host):
        raise _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)


def main() -> None:
    socket.socket.connect, socket.getaddrinfo = _connect_loopback, _getaddrinfo_loopback

    import libretranslate.init
    from argostranslate import sbd

    libretranslate.init.boot = lambda *args, **kwargs: None
    sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]

    from libretranslate.main import main as libretranslate_main

    sys.argv = ["libretranslate", *sys.argv[1:]]
    libretranslate_main()


if __name__ == "__main__":
    main()
