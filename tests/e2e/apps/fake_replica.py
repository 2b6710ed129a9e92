"""fake_replica.py PORT MODE: an app replica that misbehaves, run by the
sim runtime as an app's command (test_gateway_hardening.py). GET /health
answers 200 (so the agent's check passes); a POST, by MODE:

  liar     answers at once a tiny JSON body whose `usage` claims a million
           tokens each way
  silent   reads the request and never answers (nor closes)
  huge     answers a JSON body of about 5 MB with no `usage` but text that
           ends with one (escaped, inside the string)
  bodiless answers a HEAD 200 with a Content-Length and no body, and a GET
           of a path ending /304 with ETag "v1": 304 when If-None-Match
           names it, else 200 (GET /health is 200)
  openai   streams as OpenAI's API and vLLM do: three chunks, and the
           usage (5 prompt tokens, 3 completion tokens) in a last chunk
           with no choices only when stream_options.include_usage is
           true; each chunk's `seen` is the stream_options it was sent.
           A request's "words" makes that many content chunks instead
           (w1, w2, ...; the usage's completion tokens say so), one every
           "word_ms", as a model generating slowly would; unstreamed, one
           answer with those words as its text. A request's "claim_tokens"
           makes the usage claim that many completion tokens instead (a
           replica that lies), its "prompt_tokens" that many prompt tokens
           (5 else). An unstreamed answer with "chunked": N goes without a
           Content-Length, in chunks of N bytes, one every "word_ms"; with
           "break_after": N the replica closes the connection after N
           bytes of it (a server that died mid-answer). A stream's
           "line_end" ends its lines: LF if none, or CR or CR LF, as the
           SSE standard allows
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODE = int(sys.argv[1]), sys.argv[2]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if MODE == "bodiless" and self.path.endswith("/304"):
            fresh = self.headers.get("If-None-Match") == '"v1"'
            self.send_response(304 if fresh else 200)
            self.send_header("ETag", '"v1"')
            self.send_header("Content-Length", "0" if fresh else "3")
            self.end_headers()
            if not fresh:
                self.wfile.write(b"new")
            return
        self.reply(200, {"status": "ok"})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "17")
        self.end_headers()

    def answer(self, request, body):
        """An unstreamed answer, whole, chunked or broken off (see the top)."""
        piece, cut = request.get("chunked"), request.get("break_after")
        if not piece and cut is None:
            return self.reply(200, body)
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if piece:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        sent, piece = 0, piece or len(data)
        while sent < len(data):
            part = data[sent:sent + piece]
            if cut is not None and sent + len(part) > cut:
                part = part[:cut - sent]
            if sent:
                time.sleep(request.get("word_ms", 0) / 1000)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part) if request.get("chunked") else part)
            self.wfile.flush()
            sent += len(part)
            if cut is not None and sent >= cut:
                self.close_connection = True
                return
        if request.get("chunked"):
            self.wfile.write(b"0\r\n\r\n")

    def stream(self, request):
        include = (request.get("stream_options") or {}).get("include_usage") is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        words = [f"w{i + 1}" for i in range(request["words"])] if "words" in request else ["one", "two", "three"]
        chunks = [{"choices": [{"index": 0, "delta": {"content": w}}], "seen": request.get("stream_options")}
                  for w in words]
        if include:
            for chunk in chunks:
                chunk["usage"] = None
            chunks.append({"choices": [], "usage": {"prompt_tokens": request.get("prompt_tokens", 5),
                                                     "completion_tokens": request.get("claim_tokens", len(words))}})
        end = request.get("line_end", "\n").encode()
        for i, chunk in enumerate(chunks):
            if i:
                time.sleep(request.get("word_ms", 0) / 1000)
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + end + end)
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]" + end + end)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if MODE == "openai":
            request = json.loads(body)
            if request.get("stream"):
                return self.stream(request)
            words = [f"w{i + 1}" for i in range(request["words"])] if "words" in request else ["one", "two", "three"]
            return self.answer(request, {"choices": [{"text": " ".join(words)}],
                                         "usage": {"prompt_tokens": request.get("prompt_tokens", 5),
                                                   "completion_tokens": request.get("claim_tokens", len(words))}})
        if MODE == "silent":
            threading.Event().wait()  # holds the connection, answering nothing
        if MODE == "huge":
            text = "x" * (5 << 20) + '"usage": {"prompt_tokens": 7, "completion_tokens": 7}'
            return self.reply(200, {"choices": [{"text": text}]})
        self.reply(200, {"choices": [{"text": "hi"}],
                         "usage": {"prompt_tokens": 1000000, "completion_tokens": 1000000}})


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
