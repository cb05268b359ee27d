"""A gRPC server in Python (grpcio) for idem serve's tests.

It serves pay.Payments with generic handlers and messages as raw bytes (no
code generation): Charge answers the request's bytes reversed, with header
and trailer metadata; a request of b"decline" fails with FAILED_PRECONDITION
and status details; b"hang" never answers (the chaos test kills the
process); Watch streams three messages. Every execution prints a line
"ran METHOD REQUEST" on stdout, which the test counts. The first line is
"port N"; argv[1], if given, is the port to listen on.
"""
import sys
import threading
from concurrent import futures

import grpc


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def status_bin(code, message):
    """A google.rpc.Status with one ErrorInfo detail, encoded by hand."""
    info = field(1, 2, b"DECLINED") + field(2, 2, b"pay.example")
    detail = field(1, 2, b"type.googleapis.com/google.rpc.ErrorInfo") + field(2, 2, info)
    return field(1, 0, code) + field(2, 2, message.encode()) + field(3, 2, detail)


lock = threading.Lock()


def ran(method, request):
    with lock:
        print("ran", method, request.decode(errors="replace"), flush=True)


def charge(request, context):
    ran("Charge", request)
    if request == b"hang":
        threading.Event().wait()
    context.send_initial_metadata((("x-charge", "yes"),))
    if request == b"decline":
        context.set_trailing_metadata((
            ("grpc-status-details-bin", status_bin(9, "card declined")),
            ("x-decline", "card"),
        ))
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details("card declined")
        return b""
    context.set_trailing_metadata((("x-ledger", "entry"),))
    return request[::-1]


def watch(request, context):
    ran("Watch", request)
    for i in range(3):
        yield request + str(i).encode()


def main():
    handlers = grpc.method_handlers_generic_handler("pay.Payments", {
        "Charge": grpc.unary_unary_rpc_method_handler(charge),
        "Watch": grpc.unary_stream_rpc_method_handler(watch),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:" + (sys.argv[1] if len(sys.argv) > 1 else "0"))
    server.start()
    print("port", port, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    sys.exit(main())
