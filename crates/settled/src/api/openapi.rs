//! `GET /openapi.json`: the API's OpenAPI 3.0 document.

use axum::response::{IntoResponse, Response};

use super::problem::json_response;

/// The OpenAPI document.
pub fn document() -> serde_json::Value {
    let problem = |description: &str| {
        serde_json::json!({
            "description": description,
            "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } }
        })
    };
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
            "description": "Withdrawals that never pay twice, holds, creators. Amounts are decimal strings of token base units (they exceed 2^53). Errors are application/problem+json with a stable `type`."
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
                        "reason": { "type": "string", "minLength": 1, "maxLength": 500, "pattern": "^[^\\u0000]*\\S[^\\u0000]*$" }
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
                    "503": problem("the database is unreachable")
                }
            } },
            "/readyz": { "get": {
                "summary": "Readiness: 200 once the database answers and is migrated",
                "responses": {
                    "200": { "description": "ready", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["status"], "properties": { "status": { "type": "string" } } } } } },
                    "503": problem("not ready")
                }
            } },
            "/metrics": { "get": {
                "summary": "Prometheus metrics (text format), computed from the database's exact state",
                "responses": {
                    "200": { "description": "metrics", "content": { "text/plain": { "schema": { "type": "string" } } } },
                    "503": problem("the database failed")
                }
            } },
            "/v1/payouts": { "post": {
                "summary": "Withdraw from a creator's balance, exactly once per Idempotency-Key",
                "security": [{ "bearer": [] }],
                "parameters": [{
                    "name": "Idempotency-Key", "in": "header", "required": true,
                    "schema": { "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]([ -~]*[!-~])?$" }
                }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/PayoutRequest" } } } },
                "responses": {
                    "201": json("the payout (a repeat with the same key and body returns it again)", "Payout"),
                    "400": problem("malformed body, or a missing or over-long Idempotency-Key"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("unknown creator"),
                    "409": problem("insufficient funds, an active hold on the creator (creator-on-hold), or the first request with this key is still in progress"),
                    "413": problem("body too large"),
                    "422": problem("invalid field, or the key was used with a different request"),
                    "503": problem("the database failed; the request had no effect")
                }
            } },
            "/v1/payouts/{id}": { "get": {
                "summary": "A payout",
                "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "format": "int64", "minimum": 1, "maximum": 9_223_372_036_854_775_807i64 } }],
                "responses": {
                    "200": json("the payout", "Payout"),
                    "400": problem("the id is not an integer"),
                    "404": problem("no such payout"),
                    "503": problem("the database failed")
                }
            } },
            "/v1/creators/{address}": { "get": {
                "summary": "A creator's balance, holds and ledger entries",
                "parameters": [{ "name": "address", "in": "path", "required": true, "schema": { "$ref": "#/components/schemas/Address" } }],
                "responses": {
                    "200": json("the creator", "Creator"),
                    "400": problem("not an address"),
                    "404": problem("unknown creator"),
                    "503": problem("the database failed")
                }
            } },
            "/v1/holds": { "post": {
                "summary": "Put a creator on hold (at most one active hold per creator)",
                "security": [{ "bearer": [] }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/HoldRequest" } } } },
                "responses": {
                    "201": json("the hold", "Hold"),
                    "400": problem("malformed body"),
                    "401": problem("missing or wrong bearer token"),
                    "404": problem("unknown creator"),
                    "409": problem("the creator already has an active hold (named in the answer)"),
                    "413": problem("body too large"),
                    "422": problem("invalid field"),
                    "503": problem("the database failed")
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
                    "503": problem("the database failed")
                }
            } }
        }
    })
}

/// `GET /openapi.json`.
pub async fn serve() -> Response {
    json_response(axum::http::StatusCode::OK, "application/json", &document()).into_response()
}
