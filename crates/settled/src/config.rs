//! Settings come from flags, then environment variables, then an optional
//! `settled.toml` (in the working directory, or the file named by
//! `SETTLED_CONFIG`), then defaults. The file fills in only the environment
//! variables that are unset, before the flags are parsed, so that order holds.

use std::path::PathBuf;

/// Keys of `settled.toml` and the environment variables they stand for.
pub(crate) const CONFIG_KEYS: &[(&str, &str)] = &[
    ("database_url", "DATABASE_URL"),
    ("data_dir", "SETTLED_DATA_DIR"),
    ("schedule", "SETTLED_SCHEDULE"),
    ("timezone", "SETTLED_TIMEZONE"),
    ("catch_up_days", "SETTLED_CATCH_UP_DAYS"),
    ("concurrency", "SETTLED_CONCURRENCY"),
    ("chunk", "SETTLED_CHUNK"),
    ("mode", "SETTLED_MODE"),
    ("provider_url", "SETTLED_PROVIDER_URL"),
    ("provider_key_window", "SETTLED_PROVIDER_KEY_WINDOW"),
    ("lease_ttl_ms", "SETTLED_LEASE_TTL_MS"),
    ("rescue_interval_ms", "SETTLED_RESCUE_INTERVAL_MS"),
    ("max_attempts", "SETTLED_MAX_ATTEMPTS"),
    ("max_outage_secs", "SETTLED_MAX_OUTAGE_SECS"),
    ("log", "SETTLED_LOG"),
    ("token_decimals", "SETTLED_TOKEN_DECIMALS"),
    ("pooler", "SETTLED_POOLER"),
    ("direct_url", "SETTLED_DIRECT_URL"),
    ("run_deadline_secs", "SETTLED_RUN_DEADLINE_SECS"),
    ("verify_every_secs", "SETTLED_VERIFY_EVERY_SECS"),
];

/// Largest config file read.
pub(crate) const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Reads the config file, if any, into environment variables that are unset.
/// Must run before any thread starts (it sets environment variables).
pub(crate) fn load_into_env() -> anyhow::Result<Option<PathBuf>> {
    let (path, required) = match std::env::var_os("SETTLED_CONFIG") {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from("settled.toml"), false),
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(_) if !required => return Ok(None),
        Err(e) => anyhow::bail!("config file {}: {e}", path.display()),
    };
    anyhow::ensure!(
        meta.len() <= MAX_CONFIG_BYTES,
        "config file {} is larger than {MAX_CONFIG_BYTES} bytes",
        path.display()
    );
    let text = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
    for (key, var) in parse(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))? {
        if std::env::var_os(var).is_none() {
            // Single-threaded here: nothing else reads the environment yet.
            std::env::set_var(var, key);
        }
    }
    Ok(Some(path))
}

/// Parses the file into (value, environment variable) pairs; names the
/// unknown key or the badly typed value.
pub(crate) fn parse(text: &str) -> Result<Vec<(String, &'static str)>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = Vec::new();
    for (key, value) in table {
        let Some((_, var)) = CONFIG_KEYS.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = CONFIG_KEYS.iter().map(|(k, _)| *k).collect();
            return Err(format!("unknown key {key:?} (known: {})", known.join(", ")));
        };
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            other => {
                return Err(format!(
                    "key {key:?}: expected a string or an integer, got a {}",
                    other.type_str()
                ))
            }
        };
        out.push((text, *var));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn known_keys_map_to_variables_and_unknown_keys_are_named() {
        let pairs = parse("schedule = \"0 6 * * *\"\nconcurrency = 8\n").unwrap();
        assert!(pairs.contains(&("0 6 * * *".to_string(), "SETTLED_SCHEDULE")));
        assert!(pairs.contains(&("8".to_string(), "SETTLED_CONCURRENCY")));
        let err = parse("shedule = \"0 6 * * *\"").unwrap_err();
        assert!(err.contains("\"shedule\""), "{err}");
        assert!(parse("chunk = [1]").unwrap_err().contains("chunk"));
        assert!(parse("chunk = ").is_err());
    }
}
