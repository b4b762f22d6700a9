"""A stub Confluent Schema Registry on loopback: ``GET /subjects/<s>/versions/latest`` only.

The test tiers have no real Schema Registry; this answers the one request the relay makes,
with the envelope Confluent (and upstream's registry server) gives: ``subject``, ``id``,
``version``, ``schemaType`` and the ``.proto`` source as ``schema``; an unknown subject is
404 ``{"error_code": 40401, ...}``. ``stop()`` takes it off the network (a registry that is
down: connections are refused).
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parents[2]
#: Our jobs.proto: its first message is WorkflowRunEvent, as upstream's.
JOBS_PROTO = (ROOT / "proto/ai/pipestream/proto/jobs/v1/jobs.proto").read_text()
#: A PROTOBUF schema whose first message is another (message index [0] names it).
OTHER_PROTO = (
    'syntax = "proto3";\npackage ai.pipestream.proto.jobs.v1;\n'
    "message WorkflowRunRequest { string job_id = 1; }\n"
    "message WorkflowRunEvent { string event_id = 1; }\n"
)


class StubRegistry:
    """Subjects -> ``(id, schema text, schema type)``; counts lookups in ``calls``.

    :param port: the loopback port (0: a free one); pass a stopped registry's port to bring
        "the same" registry back.
    """

    def __init__(self, port: int = 0) -> None:
        self.subjects: dict[str, tuple[int, str, str]] = {}
        self.calls = 0
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state.calls += 1
                parts = self.path.split("/")
                subject = parts[2] if len(parts) > 2 else ""
                entry = state.subjects.get(subject)
                if self.path.endswith("/versions/latest") and entry is not None:
                    schema_id, schema, schema_type = entry
                    body: dict = {"subject": subject, "version": 1, "id": schema_id}
                    if schema_type != "AVRO":  # Confluent leaves AVRO's type out
                        body["schemaType"] = schema_type
                    body["schema"] = schema
                    code = 200
                else:
                    body = {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                    code = 404
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def register(
        self, subject: str, schema_id: int, schema: str = JOBS_PROTO, schema_type: str = "PROTOBUF"
    ) -> None:
        """Make ``subject``'s latest version ``schema`` with id ``schema_id``."""
        self.subjects[subject] = (schema_id, schema, schema_type)

    def stop(self) -> None:
        """Take the registry off the network (idempotent): its port refuses connections."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
