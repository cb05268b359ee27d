"""A gRPC client in Python (grpcio) for idem serve's tests.

It calls pay.Payments behind idem serve (argv[1], host:port) with raw bytes
and prints one JSON line per scenario, which the test checks:

  replay:     two calls with one key; the answers, headers and trailers
  error:      two calls of a failing request; codes, details and trailers
  mismatch:   a key reused with other bytes
  concurrent: 16 calls with one key at once
  stream:     a server-streaming call
"""
import base64
import json
import sys
from concurrent import futures

import grpc


def md(pairs):
    out = {}
    for k, v in pairs or ():
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        out.setdefault(k, []).append(v)
    return out


def call(charge, body, key):
    try:
        resp, c = charge.with_call(body, metadata=(("idempotency-key", key),), timeout=10)
        return {"ok": True, "body": resp.decode(), "code": c.code().name,
                "header": md(c.initial_metadata()), "trailer": md(c.trailing_metadata())}
    except grpc.RpcError as e:
        return {"ok": False, "code": e.code().name, "details": e.details(),
                "header": md(e.initial_metadata()), "trailer": md(e.trailing_metadata())}


def main():
    ch = grpc.insecure_channel(sys.argv[1])
    charge = ch.unary_unary("/pay.Payments/Charge")
    watch = ch.unary_stream("/pay.Payments/Watch")
    print(json.dumps({"scenario": "replay", "calls": [call(charge, b"abc", "py-1"), call(charge, b"abc", "py-1")]}), flush=True)
    print(json.dumps({"scenario": "error", "calls": [call(charge, b"decline", "py-2"), call(charge, b"decline", "py-2")]}), flush=True)
    print(json.dumps({"scenario": "mismatch", "calls": [call(charge, b"other", "py-1")]}), flush=True)
    with futures.ThreadPoolExecutor(max_workers=16) as pool:
        calls = list(pool.map(lambda _: call(charge, b"dup", "py-3"), range(16)))
    print(json.dumps({"scenario": "concurrent", "calls": calls}), flush=True)
    msgs = [m.decode() for m in watch(b"w", metadata=(("idempotency-key", "py-4"),), timeout=10)]
    print(json.dumps({"scenario": "stream", "messages": msgs}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
