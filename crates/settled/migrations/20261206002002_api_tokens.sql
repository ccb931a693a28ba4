-- Named API tokens with roles (viewer < app < operator < admin): only a
-- SHA-256 of each token is kept; the token is printed once, when made.
-- Every request looks its token up here, so a revocation holds at once on
-- every server. SETTLED_API_TOKEN is the admin token named `env`, kept in
-- the server's environment, never here.
CREATE TABLE settlement.api_tokens (
    name         text PRIMARY KEY
                 CHECK (length(name) BETWEEN 1 AND 64 AND name <> 'env'
                        AND ltrim(name, 'abcdefghijklmnopqrstuvwxyz0123456789._-') = ''),
    role         text NOT NULL CHECK (role IN ('viewer', 'app', 'operator', 'admin')),
    token_sha256 text NOT NULL UNIQUE CHECK (octet_length(token_sha256) = 64 AND ltrim(token_sha256, '0123456789abcdef') = ''),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL CHECK (length(created_by) <= 200),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

-- The server reads tokens and notes their last use; operators list them.
-- Tokens are made and revoked by `settled tokens`, as the tables' owner.
GRANT SELECT, UPDATE (last_used_at) ON settlement.api_tokens TO settled_api;
GRANT SELECT ON settlement.api_tokens TO settled_readonly;
