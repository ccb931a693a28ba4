-- Redeeming a one-time token, as a function: applications redeem a token
-- inside their own SQL functions (a confirmation that must hold the token,
-- decided by the database), and learn why a redemption did nothing without
-- reading the engine's table. Runs with its caller's rights.
--
-- Uses `token` up (issued -> completed) if it is for `purpose` and
-- `subject`, still issued and not expired, and answers:
--   redeemed  it was used up now (of racing callers, exactly one)
--   expired   it is for `purpose` and `subject`, unused, and past its expiry
--   refused   anything else: unknown, another purpose or subject, or used
CREATE FUNCTION settled_engine.redeem_once_token(token uuid, purpose text, subject text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE settled_engine.once_tokens t
    SET status = 'completed', reserved_at = now(), completed_at = now()
    WHERE t.id = redeem_once_token.token AND t.purpose = redeem_once_token.purpose
      AND t.subject = redeem_once_token.subject AND t.status = 'issued' AND t.expires_at > now();
    IF FOUND THEN
        RETURN 'redeemed';
    END IF;
    IF EXISTS (SELECT 1 FROM settled_engine.once_tokens t
               WHERE t.id = redeem_once_token.token AND t.purpose = redeem_once_token.purpose
                 AND t.subject = redeem_once_token.subject AND t.status = 'issued'
                 AND t.expires_at <= now()) THEN
        RETURN 'expired';
    END IF;
    RETURN 'refused';
END
$$;
