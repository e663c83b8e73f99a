#!/usr/bin/env python3
"""A stand-in for a model API in tests: answers POSTs with the responses of
a script, in order, and logs every request it got (path, headers, body) as
one JSON line each. Prints its port on stdout once it listens.

usage: fake_model_server.py SCRIPT.json LOG.jsonl
SCRIPT.json: [{"status": 200, "headers": {...}, "body": {...} or "text",
               "body_latin1": "text whose characters are the bytes sent",
               "delay_s": seconds to wait before answering (optional)}, ...]
"""
import http.server
import json
import sys
import time

script = json.load(open(sys.argv[1]))
log_path = sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length", 0))
        raw = self.rfile.read(length).decode()
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        with open(log_path, "a") as log:
            log.write(json.dumps({
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }) + "\n")
        if script:
            answer = script.pop(0)
        else:
            answer = {"status": 500, "body": {"error": {"message": "script exhausted"}}}
        time.sleep(answer.get("delay_s", 0))
        payload = answer.get("body", "")
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        if "body_latin1" in answer:  # raw bytes, 0-255 (invalid UTF-8, say)
            data = answer["body_latin1"].encode("latin-1")
        self.send_response(answer.get("status", 200))
        for k, v in answer.get("headers", {}).items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
sys.stdout.write("%d\n" % server.server_address[1])
sys.stdout.flush()
server.serve_forever()
