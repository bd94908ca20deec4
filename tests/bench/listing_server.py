"""A read-only GCS JSON-API server whose buckets are generated, not stored, for benchmarks that
need more objects than fake-gcs-server can hold.

fake-gcs-server's memory backend finds an object by a linear scan of the bucket on every
upload, so filling it takes time quadratic in the objects: 2 x 100,000 objects with 8 KiB of
metadata each did not finish in 27 minutes. What a listing benchmark measures is the mount,
not the server, so this serves the same JSON the emulator does for what `ls -l` asks: the
bucket, delimited listings in pages (`prefix`, `delimiter`, `pageToken`, `maxResults`), and
object metadata. Bucket `NAME` holds OBJECTS one-byte objects `d/obj-0000000`...; a bucket
whose name starts with `hostile` gives each META_KIB KiB of custom metadata in 8 keys, as
hostile_metadata_bench.sh uploads them.

    python3 listing_server.py PORT OBJECTS META_KIB
"""

import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, OBJECTS, META_KIB = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
GENERATION = 1700000000000000
STAMP = "2026-01-01T00:00:00.000Z"


def metadata(bucket):
    if not bucket.startswith("hostile") or META_KIB == 0:
        return None
    return {f"x-note-{i}": "n" * (META_KIB * 1024 // 8 - 16) for i in range(8)}


def item(bucket, i):
    name = f"d/obj-{i:07d}"
    link = f"http://127.0.0.1:{PORT}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
    o = {
        "kind": "storage#object",
        "selfLink": link,
        "mediaLink": link + "?alt=media",
        "etag": "CAE=",
        "id": f"{bucket}/{name}/{GENERATION + i}",
        "name": name,
        "bucket": bucket,
        "generation": str(GENERATION + i),
        "metageneration": "1",
        "contentType": "application/octet-stream",
        "size": "1",
        # CRC32C and MD5 of the one byte "x".
        "crc32c": "qTxfkw==",
        "md5Hash": "ndTkYSaMgDT1yFZOFVxnpg==",
        "timeCreated": STAMP,
        "updated": STAMP,
        "storageClass": "STANDARD",
    }
    meta = metadata(bucket)
    if meta:
        o["metadata"] = meta
    return o


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def not_found(self):
        self.send(404, {"error": {"code": 404, "message": "Not Found"}})

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.split("/")
        # /storage/v1/b/BUCKET[/o[/OBJECT]]
        if parts[1:4] != ["storage", "v1", "b"] or len(parts) < 5:
            return self.not_found()
        bucket = urllib.parse.unquote(parts[4])
        if len(parts) == 5:
            return self.send(200, {"kind": "storage#bucket", "name": bucket, "id": bucket})
        if len(parts) == 6 and parts[5] == "o":
            return self.list(bucket, q)
        if len(parts) >= 7 and parts[5] == "o":
            name = urllib.parse.unquote("/".join(parts[6:]))
            if name.startswith("d/obj-") and name[6:].isdigit() and int(name[6:]) < OBJECTS:
                return self.send(200, item(bucket, int(name[6:])))
        return self.not_found()

    def list(self, bucket, q):
        prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
        start = int(q.get("pageToken") or 0)
        limit = min(int(q.get("maxResults") or 1000), 1000)
        out = {"kind": "storage#objects"}
        if prefix == "" and delim == "/":
            out["prefixes"] = ["d/"] if OBJECTS else []
        elif prefix == "d/" or (prefix.startswith("d/") and "d/obj-".startswith(prefix)):
            end = min(start + limit, OBJECTS)
            out["items"] = [item(bucket, i) for i in range(start, end)]
            if end < OBJECTS:
                out["nextPageToken"] = str(end)
        elif prefix == "" and delim == "":
            end = min(start + limit, OBJECTS)
            out["items"] = [item(bucket, i) for i in range(start, end)]
            if end < OBJECTS:
                out["nextPageToken"] = str(end)
        self.send(200, out)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
