"""A tiny GPU HTTP server for the server-path proof: each request runs a matmul in a stage."""
import http.server
import socketserver
import sys

import torch

import maxinstr

port = int(sys.argv[1])
w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
for _ in range(3):  # load + warm-up (not captured: nsys only collects between start and stop)
    (w @ w).sum().item()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with maxinstr.stage("handle"):
            value = float((w @ w).float().sum().item())
        self.send_response(200)
        self.end_headers()
        self.wfile.write(f"{value:.3f}".encode())

    def log_message(self, *args):
        pass


socketserver.TCPServer.allow_reuse_address = True
with socketserver.TCPServer(("127.0.0.1", port), Handler) as server:
    print(f"Server ready on {port}", flush=True)
    server.serve_forever()
