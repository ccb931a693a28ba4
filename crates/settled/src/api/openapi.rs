//! `GET /openapi.json`: the API's OpenAPI 3.0 document.

use axum::response::{IntoResponse, Response};

use super::problem::json_response;

/// The OpenAPI document, with this server's idempotency-key retention.
pub fn document(retention_hours: u64) -> serde_json::Value {
    let problem = |description: &str| {
        let mut answer = serde_json::json!({
            "description": description,
            "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } }
        });
        if description.starts_with("retry") {
            answer["headers"] = serde_json::json!({
                "Retry-After": { "description": "seconds to wait before retrying", "schema": { "type": "integer" } }
            });
        }
        answer
    };
    let unavailable = "retry: the database failed or a lock or statement took longer than the API waits (database-busy); the request had no effect";
    let unavailable_write = "retry: the database failed or a lock or statement took longer than the API waits (database-busy), and the request had no effect; or the answer to its COMMIT was lost (outcome-unknown), and it may or may not have taken effect: retrying is safe (a payout with the same Idempotency-Key answers its outcome; a repeated hold or release answers 409 if the first took effect)";
    let wrong_host = "the Host header names a host this server does not serve";
    let queue_name = serde_json::json!({
        "name": "name", "in": "path", "required": true,
        "schema": { "type": "string", "pattern": "^[a-z_][a-z0-9_]*$", "maxLength": 63 }
    });
    let json = |description: &str, schema: &str| {
        serde_json::json!({
            "description": description,
            "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
        })
    };
    serde_json::json!({
        "openapi": "3.0.3",
        "info": {
            "title": "settled API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!("Withdrawals that never pay twice, holds, creators, continuous queues. Amounts are decimal strings of token base units (they exceed 2^53). Errors are application/problem+json with a stable `type`. Bodies are application/json objects that name each field once. Idempotency-Key (IETF draft-ietf-httpapi-idempotency-key-header) is an sf-string, quoted or bare; this server keeps a key and its response for {retention_hours} h (then prunes them), and a payout for ever. A key belongs to the request that used it first while any trace of that request is kept (its stored response, even past the retention, until pruned; the payout it made, for ever): another request with it gets 422 idempotency-key-reused, and a repeat of the request, however late, gets its answer or, once the answer is pruned, the payout it made; never a second payout. A key whose request was refused is free once its response is pruned.")
        },
        "servers": [{ "url": "/" }],
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "detail"],
                    "properties": {
                        "type": { "type": "string" },
                        "title": { "type": "string" },
                        "status": { "type": "integer" },
                        "detail": { "type": "string" },
                        "field": { "type": "string" },
                        "balance": { "type": "string" },
                        "hold": { "type": "integer" },
                        "existing_hold_id": { "type": "integer", "nullable": true }
                    }
                },
                "Address": {
                    "type": "string",
                    "pattern": "^0x([0-9a-f]{40}|[0-9A-F]{40})$",
                    "description": "0x + 40 hex digits. Mixed case is also accepted when it is a valid EIP-55 checksum."
                },
                "Amount": {
                    "type": "string",
                    "pattern": "^0*[1-9][0-9]{0,76}$",
                    "description": "Token base units, a decimal integer from 1 to 2^256 - 1 (78-digit values up to 2^256 - 1 are accepted too)."
                },
                "PayoutRequest": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["creator", "amount"],
                    "properties": {
                        "creator": { "$ref": "#/components/schemas/Address" },
                        "amount": { "$ref": "#/components/schemas/Amount" }
                    }
                },
                "Payout": {
                    "type": "object",
                    "required": ["id", "creator", "amount", "status", "created_at"],
                    "properties": {
                        "id": { "type": "integer" },
                        "creator": { "type": "string" },
                        "amount": { "type": "string" },
                        "status": { "type": "string", "enum": ["completed"] },
                        "created_at": { "type": "string", "format": "date-time" }
                    }
                },
                "HoldRequest": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["creator", "reason"],
                    "properties": {
                        "creator": { "$ref": "#/components/schemas/Address" },
                        "reason": { "type": "string", "minLength": 1, "maxLength": 500, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]*\\S[^\\u0000-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]*$", "description": "one line of text: no control characters or direction overrides" }
                    }
                },
                "Hold": {
                    "type": "object",
                    "required": ["id", "creator", "reason", "created_at", "released_at"],
                    "properties": {
                        "id": { "type": "integer" },
                        "creator": { "type": "string" },
                        "reason": { "type": "string" },
                        "created_at": { "type": "string", "format": "date-time" },
                        "released_at": { "type": "string", "format": "date-time", "nullable": true }
                    }
                },
                "QueueStats": {
                    "type": "object",
                    "required": ["ready", "scheduled", "processing", "failed", "oldest_ready_secs", "paused"],
                    "properties": {
                        "ready": { "type": "integer", "description": "eligible and runnable now" },
                        "scheduled": { "type": "integer", "description": "eligible, not before a later time (scheduled or backing off)" },
                        "processing": { "type": "integer", "description": "claimed under a lease" },
                        "failed": { "type": "integer", "description": "dead letters" },
                        "oldest_ready_secs": { "type": "number", "description": "seconds since the oldest ready job could run (0 when none)" },
                        "paused": { "type": "boolean" }
                    }
                },
                "Queue": {
                    "type": "object",
                    "required": ["name", "table", "paused", "paused_at", "stats", "error"],
                    "properties": {
                        "name": { "type": "string" },
                        "table": { "type": "string" },
                        "paused": { "type": "boolean" },
                        "paused_at": { "type": "string", "format": "date-time", "nullable": true },
                        "stats": { "allOf": [{ "$ref": "#/components/schemas/QueueStats" }], "nullable": true, "description": "exact counts; null when `error` says why they cannot be read" },
                        "error": { "type": "string", "nullable": true, "description": "why the queue's table cannot be read (missing, not conforming, no privilege)" }
                    }
                },
                "DeadLetter": {
                    "type": "object",
                    "required": ["key", "attempts", "last_error", "failed_at", "history"],
                    "properties": {
                        "key": { "type": "string" },
                        "attempts": { "type": "integer", "description": "attempts counted toward the queue's limit (since its last replay)" },
                        "last_error": { "type": "string", "nullable": true },
                        "failed_at": { "type": "string", "format": "date-time" },
                        "history": { "type": "array", "description": "the attempt history, oldest first", "items": {
                            "type": "object",
                            "properties": {
                                "attempt": { "type": "integer" },
                                "at": { "type": "string", "format": "date-time" },
                                "error": { "type": "string" }
                            }
                        } }
                    }
                },
                "ReplayRequest": {
                    "type": "object",
                    "additionalProperties": false,
                    "description": "every member optional; those that are set must all hold; none: every dead letter (up to limit)",
                    "properties": {
                        "key": { "type": "string", "minLength": 1 },
                        "error_contains": { "type": "string", "minLength": 1 },
                        "failed_since": { "type": "string", "format": "date-time", "description": "RFC 3339; failed at or after" },
                        "failed_before": { "type": "string", "format": "date-time", "description": "RFC 3339; failed before (later than failed_since)" },
                        "limit": { "type": "integer", "minimum": 1, "maximum": 10000, "description": "oldest failure first; 10000 by default" }
                    }
                },
                "CancelRequest": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["key"],
                    "properties": { "key": { "type": "string" } }
                },
                "QueuePause": {
                    "type": "object",
                    "required": ["queue", "paused", "changed"],
                    "properties": {
                        "queue": { "type": "string" },
                        "paused": { "type": "boolean" },
                        "changed": { "type": "boolean", "description": "false when the queue already was so" }
                    }
                },
                "Creator": {
                    "type": "object",
                    "required": ["creator", "balance", "holds", "ledger"],
                    "properties": {
                        "creator": { "type": "string" },
                        "balance": { "type": "string" },
                        "holds": { "type": "array", "items": {
                            "type": "object",
                            "required": ["id", "reason", "created_at", "released_at", "active"],
                            "properties": {
                                "id": { "type": "integer" },
                                "reason": { "type": "string" },
                                "created_at": { "type": "string", "format": "date-time" },
                                "released_at": { "type": "string", "format": "date-time", "nullable": true },
                                "active": { "type": "boolean" }
                            }
                        } },
                        "ledger": { "type": "array", "items": {
                            "type": "object",
                            "required": ["period", "amount", "run_id", "created_at"],
                            "properties": {
                                "period": { "type": "string", "format": "date" },
                                "amount": { "type": "string" },
                                "run_id": { "type": "integer" },
                                "created_at": { "type": "string", "format": "date-time" }
                            }
                        } }
                    }
                }
            }
        },
        "paths": {
            "/healthz": { "get": {
                "summary": "Liveness: 200 once the server can reach the database",
                "responses": {
                    "200": { "description": "healthy", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["status"], "properties": { "status": { "type": "string" } } } } } },
                    "503": problem("retry: the database is unreachable")
                }
            } },
            "/readyz": { "get": {
                "summary": "Readiness: 200 once the database answers, is migrated, and takes writes",
                "responses": {
                    "200": { "description": "ready", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["status"], "properties": { "status": { "type": "string" } } } } } },
                    "503": problem("not ready: the database is unreachable, lacks migrations (not-migrated), or takes no writes (read-only: a standby, or default_transaction_read_only)")
                }
            } },
            "/metrics": { "get": {
                "summary": "Prometheus metrics (text format), computed from the database's exact state",
                "responses": {
                    "200": { "description": "metrics", "content": { "text/plain": { "schema": { "type": "string" } } } },
                    "421": problem(wrong_host),
                    "503": problem(unavailable)
                }
            } },
            "/v1/payouts": { "post": {
                "summary": "Withdraw from a creator's balance, exactly once per Idempotency-Key",
                "security": [{ "bearer": [] }],
                "parameters": [{
                    "name": "Idempotency-Key", "in": "header", "required": true,
                    "schema": { "oneOf": [
                        { "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!#-\\[\\]-~]([ !#-\\[\\]-~]*[!#-\\[\\]-~])?$" },
                        { "type": "string", "minLength": 3, "maxLength": 257, "pattern": "^\"([ !#-\\[\\]-~]|\\\\[\"\\\\])+\"$" }
                    ] },
                    "description": format!("an sf-string (\"abc\") or the bare token (abc), the same key either way; at most 255 characters; kept {retention_hours} h")
                }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/PayoutRequest" } } } },
                "responses": {
                    "201": json("the payout (a repeat with the same key and body returns it again)", "Payout"),
                    "400": problem("malformed body (a field named twice: duplicate-field, naming it), or a missing or over-long Idempotency-Key"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("unknown creator"),
                    "409": problem("insufficient funds, an active hold on the creator (creator-on-hold), or a request with this key is still in progress (request-in-progress)"),
                    "408": problem("the body did not arrive in time (body-timeout); the connection is closed and nothing was done"),
                    "413": problem("body too large"),
                    "415": problem("the body is not sent as application/json"),
                    "421": problem(wrong_host),
                    "422": problem("invalid field, or the key belongs to a different request (idempotency-key-reused)"),
                    "503": problem(unavailable_write)
                }
            } },
            "/v1/payouts/{id}": { "get": {
                "summary": "A payout",
                "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "format": "int64", "minimum": 1, "maximum": 9_223_372_036_854_775_807i64 } }],
                "responses": {
                    "200": json("the payout", "Payout"),
                    "400": problem("the id is not an integer"),
                    "404": problem("no such payout"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable)
                }
            } },
            "/v1/creators/{address}": { "get": {
                "summary": "A creator's balance, holds and ledger entries",
                "parameters": [{ "name": "address", "in": "path", "required": true, "schema": { "$ref": "#/components/schemas/Address" } }],
                "responses": {
                    "200": json("the creator", "Creator"),
                    "400": problem("not an address"),
                    "404": problem("unknown creator"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable)
                }
            } },
            "/v1/queues": { "get": {
                "summary": "Every registered continuous queue with its exact state (a queue whose table cannot be read carries the error)",
                "responses": {
                    "200": { "description": "the queues, by name", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["queues"],
                        "properties": { "queues": { "type": "array", "items": { "$ref": "#/components/schemas/Queue" } } } } } } },
                    "421": problem(wrong_host),
                    "503": problem(unavailable)
                }
            } },
            "/v1/queues/{name}": { "get": {
                "summary": "A continuous queue's exact state",
                "parameters": [queue_name.clone()],
                "responses": {
                    "200": json("the queue", "Queue"),
                    "404": problem("no such queue (unknown-queue)"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable)
                }
            } },
            "/v1/queues/{name}/dead": { "get": {
                "summary": "A queue's dead letters, newest failure first",
                "parameters": [queue_name.clone(), {
                    "name": "limit", "in": "query", "required": false,
                    "schema": { "type": "integer", "minimum": 1, "maximum": 1000, "default": 50 }
                }],
                "responses": {
                    "200": { "description": "the dead letters", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["queue", "dead_letters"],
                        "properties": {
                            "queue": { "type": "string" },
                            "dead_letters": { "type": "array", "items": { "$ref": "#/components/schemas/DeadLetter" } }
                        } } } } },
                    "400": problem("limit is not an integer 1..=1000 (invalid-limit)"),
                    "404": problem("no such queue (unknown-queue)"),
                    "409": problem("the queue's table is missing, does not conform or cannot be read (queue-unusable)"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable)
                }
            } },
            "/v1/queues/{name}/pause": { "post": {
                "summary": "Pause a queue: its workers claim nothing until it is resumed",
                "security": [{ "bearer": [] }],
                "parameters": [queue_name.clone()],
                "responses": {
                    "200": json("paused (changed: false when it already was)", "QueuePause"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("no such queue (unknown-queue)"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable_write)
                }
            } },
            "/v1/queues/{name}/resume": { "post": {
                "summary": "Resume a paused queue and wake its workers",
                "security": [{ "bearer": [] }],
                "parameters": [queue_name.clone()],
                "responses": {
                    "200": json("serving (changed: false when it was not paused)", "QueuePause"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("no such queue (unknown-queue)"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable_write)
                }
            } },
            "/v1/queues/{name}/replay": { "post": {
                "summary": "Make dead letters eligible again with a fresh count of attempts: one by key, or those a filter selects",
                "security": [{ "bearer": [] }],
                "parameters": [queue_name.clone()],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReplayRequest" } } } },
                "responses": {
                    "200": { "description": "how many were replayed", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["queue", "replayed", "limit_reached"],
                        "properties": {
                            "queue": { "type": "string" },
                            "replayed": { "type": "integer", "minimum": 1 },
                            "limit_reached": { "type": "boolean", "description": "as many as the limit: more may match" }
                        } } } } },
                    "400": problem("malformed body (a field named twice: duplicate-field, naming it)"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("no such queue (unknown-queue), or no dead letter matches (no-dead-letter-matched)"),
                    "408": problem("the body did not arrive in time (body-timeout); the connection is closed and nothing was done"),
                    "409": problem("the queue's table is missing, does not conform or cannot be read (queue-unusable)"),
                    "413": problem("body too large"),
                    "415": problem("the body is not sent as application/json"),
                    "421": problem(wrong_host),
                    "422": problem("invalid field (named)"),
                    "503": problem(unavailable_write)
                }
            } },
            "/v1/queues/{name}/cancel": { "post": {
                "summary": "Cancel a job that has not started",
                "security": [{ "bearer": [] }],
                "parameters": [queue_name],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CancelRequest" } } } },
                "responses": {
                    "200": { "description": "the job will not run", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["queue", "key", "cancelled"],
                        "properties": {
                            "queue": { "type": "string" },
                            "key": { "type": "string" },
                            "cancelled": { "type": "boolean", "enum": [true] }
                        } } } } },
                    "400": problem("malformed body (a field named twice: duplicate-field, naming it)"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("no such queue (unknown-queue) or job (unknown-job)"),
                    "408": problem("the body did not arrive in time (body-timeout); the connection is closed and nothing was done"),
                    "409": problem("the job has started or ended (job-started), or the queue's table cannot serve (queue-unusable)"),
                    "413": problem("body too large"),
                    "415": problem("the body is not sent as application/json"),
                    "421": problem(wrong_host),
                    "422": problem("the key is not a value of the queue's key type"),
                    "503": problem(unavailable_write)
                }
            } },
            "/v1/holds": { "post": {
                "summary": "Put a creator on hold (at most one active hold per creator)",
                "security": [{ "bearer": [] }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/HoldRequest" } } } },
                "responses": {
                    "201": json("the hold", "Hold"),
                    "400": problem("malformed body (a field named twice: duplicate-field, naming it)"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("unknown creator"),
                    "409": problem("the creator already has an active hold (named in the answer)"),
                    "408": problem("the body did not arrive in time (body-timeout); the connection is closed and nothing was done"),
                    "413": problem("body too large"),
                    "415": problem("the body is not sent as application/json"),
                    "421": problem(wrong_host),
                    "422": problem("invalid field"),
                    "503": problem(unavailable_write)
                }
            } },
            "/v1/holds/{id}/release": { "post": {
                "summary": "Release a hold; the creator's held items are paid by their runs",
                "security": [{ "bearer": [] }],
                "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "format": "int64", "minimum": 1, "maximum": 9_223_372_036_854_775_807i64 } }],
                "responses": {
                    "200": json("the released hold", "Hold"),
                    "400": problem("the id is not an integer"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("no such hold"),
                    "409": problem("already released"),
                    "421": problem(wrong_host),
                    "503": problem(unavailable_write)
                }
            } }
        }
    })
}

/// `GET /openapi.json`.
pub async fn serve(axum::extract::State(state): axum::extract::State<super::AppState>) -> Response {
    let hours = state.idempotency.retention.as_secs() / 3600;
    json_response(axum::http::StatusCode::OK, "application/json", &document(hours)).into_response()
}
