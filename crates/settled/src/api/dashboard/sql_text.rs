//! SQL text made safe to show: literals (where passwords and customer data
//! sit) and the values of settings replaced by `?`, comments dropped, the
//! statement's shape kept.

/// `sql` with every string literal (`'...'`, `E'...'`, `$tag$...$tag$`) and
/// number replaced by `?`, every comment dropped (block comments nest, as
/// PostgreSQL's do), and the value of every `SET name TO|= value` outside
/// an UPDATE, INSERT or MERGE replaced by `?` (an unquoted value is a word
/// like any other). An unterminated literal or comment, as in text cut at
/// a length limit, is hidden to its end. Identifiers, keywords and
/// parameters (`$1`) are kept.
pub(crate) fn without_literals(sql: &str) -> String {
    without_setting_values(&without_literals_and_comments(sql))
}

fn without_literals_and_comments(sql: &str) -> String {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    while i < chars.len() {
        let c = chars[i];
        let prev = if i == 0 { None } else { Some(chars[i - 1]) };
        match c {
            '\'' => {
                // E'...' (backslash escapes) when the E starts a word.
                let backslash = matches!(prev, Some('e' | 'E')) && (i < 2 || !ident(chars[i - 2]));
                i += 1;
                while i < chars.len() {
                    match chars[i] {
                        '\\' if backslash => i += 2,
                        '\'' if chars.get(i + 1) == Some(&'\'') => i += 2,
                        '\'' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
                out.push('?');
            }
            '$' if !prev.is_some_and(ident) => match dollar_tag(&chars[i..]) {
                Some(tag) => {
                    let body = i + tag.len();
                    let close = find(&chars, body, &tag);
                    i = close.map_or(chars.len(), |at| at + tag.len());
                    out.push('?');
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            },
            '"' => {
                // A quoted identifier: kept as it is.
                out.push(c);
                i += 1;
                while i < chars.len() {
                    out.push(chars[i]);
                    i += 1;
                    if chars[i - 1] == '"' {
                        if chars.get(i) == Some(&'"') {
                            out.push('"');
                            i += 1;
                        } else {
                            break;
                        }
                    }
                }
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                i = block_comment_end(&chars, i);
                out.push(' ');
            }
            c if c.is_ascii_digit() && !prev.is_some_and(ident) => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_') {
                    i += 1;
                }
                out.push('?');
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Where the block comment opening at `start` ends (after its `*/`),
/// counting the comments nested in it; the text's end if it never does.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// First words of the statements whose `SET` assigns columns, whose values
/// are expressions already stripped of their literals: kept.
const COLUMN_SET_STATEMENTS: [&str; 4] = ["update", "insert", "merge", "with"];

/// `sql` (already without literals and comments) with the value of each
/// configuration `SET` hidden: `SET [SESSION|LOCAL] name TO|= ?`, and
/// `SET name ?` for the forms without TO or = (`SET ROLE ?`). The value
/// runs to the statement's end, a `;` outside a quoted identifier.
fn without_setting_values(sql: &str) -> String {
    let tokens = tokens(sql);
    let mut out = String::with_capacity(sql.len());
    let mut at = 0;
    let mut first_word: Option<String> = None;
    while at < tokens.len() {
        let token = tokens[at];
        out.push_str(token);
        at += 1;
        if token == ";" {
            first_word = None;
        } else if is_word(token) && first_word.is_none() {
            first_word = Some(token.to_ascii_lowercase());
        }
        let column_set = first_word
            .as_deref()
            .is_some_and(|w| COLUMN_SET_STATEMENTS.contains(&w));
        if token.eq_ignore_ascii_case("set") && !column_set {
            at = setting_name(&tokens, at, &mut out);
            let value_end = (at..tokens.len()).find(|&t| tokens[t] == ";").unwrap_or(tokens.len());
            if tokens[at..value_end].iter().any(|t| !t.trim().is_empty()) {
                out.push('?');
            }
            at = value_end;
        }
    }
    out
}

/// Copies, from `tokens[at..]`, what names the setting after a `SET`:
/// spaces, `SESSION` or `LOCAL`, the (dotted) name, and `TO` or `=` with
/// the spaces after it. Returns where the value starts.
fn setting_name(tokens: &[&str], mut at: usize, out: &mut String) -> usize {
    let take = |at: &mut usize, out: &mut String, ok: &dyn Fn(&str) -> bool| {
        while *at < tokens.len() && ok(tokens[*at]) {
            out.push_str(tokens[*at]);
            *at += 1;
        }
    };
    let space = |t: &str| t.trim().is_empty();
    take(&mut at, out, &space);
    if tokens
        .get(at)
        .is_some_and(|t| t.eq_ignore_ascii_case("session") || t.eq_ignore_ascii_case("local"))
    {
        out.push_str(tokens[at]);
        at += 1;
        take(&mut at, out, &space);
    }
    let name_part = |t: &&str| is_word(t) || t.starts_with('"');
    while tokens.get(at).is_some_and(name_part) {
        out.push_str(tokens[at]);
        at += 1;
        if tokens.get(at) == Some(&".") && tokens.get(at + 1).is_some_and(name_part) {
            out.push('.');
            at += 1;
        } else {
            break;
        }
    }
    take(&mut at, out, &space);
    if tokens
        .get(at)
        .is_some_and(|t| t.eq_ignore_ascii_case("to") || *t == "=")
    {
        out.push_str(tokens[at]);
        at += 1;
        take(&mut at, out, &space);
    }
    at
}

/// `sql` cut into words (letters, digits, `_`, `$`), quoted identifiers,
/// runs of whitespace and single other characters; joined, they are `sql`.
fn tokens(sql: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        let len = if c == '"' {
            quoted_identifier_len(rest)
        } else if is_word_char(c) {
            rest.find(|c| !is_word_char(c)).unwrap_or(rest.len())
        } else if c.is_whitespace() {
            rest.find(|c: char| !c.is_whitespace()).unwrap_or(rest.len())
        } else {
            c.len_utf8()
        };
        out.push(&rest[..len]);
        rest = &rest[len..];
    }
    out
}

/// Bytes of the quoted identifier at the start of `text` (`""` inside is
/// a quote); to the end if it is not closed.
fn quoted_identifier_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut i = 1;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            if bytes.get(i + 1) == Some(&b'"') {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    bytes.len()
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

fn is_word(token: &str) -> bool {
    token.chars().next().is_some_and(is_word_char)
}

/// The tag opening a dollar-quoted string at the start of `text` (`$$` or
/// `$name$`), or None (e.g. a parameter `$1`).
fn dollar_tag(text: &[char]) -> Option<Vec<char>> {
    let mut end = 1;
    while end < text.len() && text[end] != '$' {
        let c = text[end];
        let ok = if end == 1 {
            c.is_alphabetic() || c == '_'
        } else {
            c.is_alphanumeric() || c == '_'
        };
        if !ok {
            return None;
        }
        end += 1;
    }
    (end < text.len()).then(|| text[..=end].to_vec())
}

fn find(chars: &[char], from: usize, needle: &[char]) -> Option<usize> {
    (from..chars.len().saturating_sub(needle.len() - 1)).find(|&at| chars[at..].starts_with(needle))
}

#[cfg(test)]
mod tests {
    use super::without_literals;

    #[test]
    fn literals_numbers_and_comments_are_hidden_identifiers_and_parameters_kept() {
        let cases = [
            (
                "CREATE ROLE x LOGIN PASSWORD 'S3cr3t';",
                "CREATE ROLE x LOGIN PASSWORD ?;",
            ),
            ("SELECT 'it''s', E'a\\'b' FROM t", "SELECT ?, E? FROM t"),
            ("ALTER ROLE x PASSWORD $$S3cr3t$$", "ALTER ROLE x PASSWORD ?"),
            ("SELECT $pw$S3cr3t$pw$, $1, t1.c2", "SELECT ?, $1, t1.c2"),
            (
                "UPDATE \"Odd\"\"Name\" SET a = 42.5e3 WHERE id = 7",
                "UPDATE \"Odd\"\"Name\" SET a = ? WHERE id = ?",
            ),
            ("SELECT 1 -- S3cr3t\nFROM t /* S3cr3t */", "SELECT ? \nFROM t  "),
            ("INSERT INTO t VALUES ('cut at the limit S3c", "INSERT INTO t VALUES (?"),
            ("SELECT $$never closed S3cr3t", "SELECT ?"),
        ];
        for (sql, shown) in cases {
            assert_eq!(without_literals(sql), shown, "{sql}");
            assert!(!without_literals(sql).contains("S3c"), "{sql}");
        }
    }

    #[test]
    fn nested_comments_and_setting_values_are_hidden_column_assignments_kept() {
        let cases = [
            ("SELECT 1 /* a /* b */ S3cr3t */ FROM t", "SELECT ?   FROM t"),
            ("SELECT /* /* /* x */ */ S3cr3t */ c", "SELECT   c"),
            ("SELECT /* never /* closed */ S3cr3t", "SELECT  "),
            ("SET x TO S3cr3t", "SET x TO ?"),
            ("set my.pw = S3cr3t, other", "set my.pw = ?"),
            ("SET LOCAL x=S3cr3t; SELECT c FROM t", "SET LOCAL x=?; SELECT c FROM t"),
            ("SET \"odd;name\" TO \"S3cr3t\"", "SET \"odd;name\" TO ?"),
            (
                "ALTER ROLE bob SET search_path TO S3cr3t",
                "ALTER ROLE bob SET search_path TO ?",
            ),
            ("SET ROLE S3cr3t", "SET ROLE ?"),
            ("SET SESSION AUTHORIZATION S3cr3t", "SET SESSION AUTHORIZATION ?"),
            ("SET x", "SET x"),
            (
                "UPDATE t SET a = b, c = 5 WHERE d = 'S3cr3t'",
                "UPDATE t SET a = b, c = ? WHERE d = ?",
            ),
            (
                "INSERT INTO t VALUES (1) ON CONFLICT (k) DO UPDATE SET a = EXCLUDED.a",
                "INSERT INTO t VALUES (?) ON CONFLICT (k) DO UPDATE SET a = EXCLUDED.a",
            ),
            ("RESET x; SELECT offset", "RESET x; SELECT offset"),
        ];
        for (sql, shown) in cases {
            assert_eq!(without_literals(sql), shown, "{sql}");
        }
    }

    /// A secret in a comment nested `depth` deep, after the inner comments close.
    fn nested_comment(depth: usize, secret: &str) -> String {
        (0..depth).fold(secret.to_string(), |inner, d| format!("/* c{d} {inner} {secret} */"))
    }

    proptest::proptest! {
        #[test]
        fn no_secret_in_a_nested_comment_or_a_setting_value_survives(
            depth in 1usize..6,
            secret in "S3cr3t[a-z0-9_]{0,8}",
            set in proptest::sample::select(vec![
                "SET", "set", "SET LOCAL", "Set Session", "ALTER ROLE bob SET", "ALTER SYSTEM SET",
                "ALTER DATABASE d SET", "ALTER ROLE bob IN DATABASE d SET", "ALTER FUNCTION f() SET",
            ]),
            name in proptest::sample::select(vec!["x", "my.setting", "\"Odd\".name", "search_path"]),
            assign in proptest::sample::select(vec![" TO ", " = ", "=", " to ", "\tTO\n"]),
            value in proptest::sample::select(vec!["{}", "a, {}", "\"{}\"", "{} /* c */", "'{}'", "$${}$$"]),
            lead in proptest::sample::select(vec!["", "  ", "/* a */ ", "-- a\n", "SELECT 1; "]),
            tail in proptest::sample::select(vec!["", ";", "; SELECT c FROM t", " -- end\n"]),
        ) {
            let value = value.replace("{}", &secret);
            let sql = format!(
                "{lead}{set} {}{name}{assign}{value}{tail}; SELECT c {} FROM t",
                nested_comment(depth, &secret),
                nested_comment(depth, &secret),
            );
            let shown = without_literals(&sql);
            proptest::prop_assert!(!shown.contains("S3cr3t"), "{} -> {}", sql, shown);
            proptest::prop_assert!(shown.contains("SELECT c"), "{} -> {}", sql, shown);
            proptest::prop_assert!(shown.contains("FROM t"), "{} -> {}", sql, shown);
        }

        #[test]
        fn column_assignments_keep_their_shape(
            column in "[a-z][a-z0-9_]{0,8}",
            other in "[a-z][a-z0-9_]{0,8}",
            first in proptest::sample::select(vec!["UPDATE t", "update only t AS u", "WITH w AS (SELECT ?) UPDATE t"]),
        ) {
            let sql = format!("{first} SET {column} = {other} WHERE {other} = $1");
            let shown = without_literals(&sql);
            proptest::prop_assert_eq!(&shown, &sql);
        }
    }
}
