//! The value parser of every flag that carries a secret (the API token, the
//! webhook secrets, database URLs, which may hold a password): its errors
//! name the environment variable and the flag, never the value. clap's own
//! "invalid value '...'" repeats the value, into the journal of a service.
//! Such flags also set `hide_env_values`, so `--help` does not show them.

use std::ffi::OsStr;

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;

/// Parses a secret flag's text with a function whose error names what is
/// wrong with the value and never the value itself.
#[derive(Clone, Copy)]
pub struct SecretParser<T>(fn(&str) -> Result<T, String>);

impl<T> SecretParser<T> {
    /// A parser that checks the text with `parse`.
    pub(crate) const fn new(parse: fn(&str) -> Result<T, String>) -> SecretParser<T> {
        SecretParser(parse)
    }
}

impl SecretParser<String> {
    /// Any text (a URL is checked where it is used, by code that redacts it).
    pub const fn text() -> SecretParser<String> {
        SecretParser(|text| Ok(text.to_string()))
    }
}

impl<T: Clone + Send + Sync + 'static> TypedValueParser for SecretParser<T> {
    type Value = T;

    fn parse_ref(&self, _cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<T, clap::Error> {
        let (name, env) = names_of(arg);
        // One line, as clap's raw errors are; exit code 2, as for any usage error.
        let refuse = |why: String| clap::Error::raw(ErrorKind::ValueValidation, format!("{why}\n"));
        let text = value
            .to_str()
            .ok_or_else(|| refuse(format!("{name} is not valid UTF-8")))?;
        (self.0)(text).map_err(|why| match env {
            Some(env) if why.contains(&env) => refuse(why),
            _ => refuse(format!("{name}: {why}")),
        })
    }
}

/// `VAR (--flag)`, `--flag` or `VAR` as the argument has them, and its variable.
fn names_of(arg: Option<&clap::Arg>) -> (String, Option<String>) {
    let env = arg
        .and_then(clap::Arg::get_env)
        .map(|env| env.to_string_lossy().into_owned());
    let flag = arg.and_then(clap::Arg::get_long).map(|long| format!("--{long}"));
    let name = match (&env, flag) {
        (Some(env), Some(flag)) => format!("{env} ({flag})"),
        (Some(env), None) => env.clone(),
        (None, Some(flag)) => flag,
        (None, None) => "a secret argument".to_string(),
    };
    (name, env)
}
