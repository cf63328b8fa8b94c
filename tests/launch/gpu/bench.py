"""Benchmark client for the server proof: N requests, prints how many succeeded."""
import sys
import urllib.request

port, n = int(sys.argv[1]), int(sys.argv[2])
ok = 0
for _ in range(n):
    ok += urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).status == 200
print(f"bench: {ok}/{n} ok", flush=True)
sys.exit(0 if ok == n else 1)
