//! SQL text made safe to show: literals (where passwords and customer data
//! sit) replaced by `?`, comments dropped, the statement's shape kept.

/// `sql` with every string literal (`'...'`, `E'...'`, `$tag$...$tag$`),
/// number and comment replaced by `?` (comments by nothing). An unterminated
/// literal, as in text cut at a length limit, is hidden to its end.
/// Identifiers, keywords and parameters (`$1`) are kept.
pub fn without_literals(sql: &str) -> String {
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
                let close: Vec<char> = "*/".chars().collect();
                i = find(&chars, i + 2, &close).map_or(chars.len(), |at| at + 2);
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
}
