//! Parsing one line of an input file into a validated row. Pure functions:
//! no I/O, no allocation beyond the row (also the fuzzing entry points).

use crate::address::CreatorAddress;
use crate::json::ObjectError;
use crate::money::Amount;
use crate::period::Period;

/// Longest line accepted, in bytes (without its line ending).
pub(crate) const MAX_LINE_BYTES: usize = 4096;

/// Input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// `period,creator,volume` (or `creator,volume` with `--period`), one header line allowed.
    Csv,
    /// One JSON object per line: `{"period": "...", "creator": "...", "volume": "..."}`.
    Jsonl,
}

/// A validated row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The period.
    pub period: Period,
    /// The creator (lower case).
    pub creator: CreatorAddress,
    /// The volume.
    pub volume: Amount,
}

/// What is wrong with a line: the field (or `line`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `period`, `creator`, `volume`, or `line` for the line as a whole.
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl FieldError {
    fn new(field: &'static str, reason: impl Into<String>) -> FieldError {
        FieldError {
            field,
            reason: reason.into(),
        }
    }
}

/// CSV columns, decided by the header (or by `--period`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Columns {
    /// `period,creator,volume`.
    PeriodCreatorVolume,
    /// `creator,volume` (the period comes from `--period`).
    CreatorVolume,
}

/// Recognises a CSV header line.
pub fn csv_header(line: &str) -> Option<Columns> {
    let names: Vec<String> = line
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_ascii_lowercase())
        .collect();
    match names.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["period", "creator", "volume"] => Some(Columns::PeriodCreatorVolume),
        ["creator", "volume"] => Some(Columns::CreatorVolume),
        _ => None,
    }
}

fn unquote(field: &str) -> Result<&str, String> {
    let f = field.trim();
    if let Some(inner) = f.strip_prefix('"') {
        return inner
            .strip_suffix('"')
            .filter(|i| !i.contains('"'))
            .ok_or_else(|| "has an unbalanced quote".to_string());
    }
    if f.contains('"') {
        return Err("has a stray quote".into());
    }
    Ok(f)
}

/// Validates the three values of a row.
pub(crate) fn validate(
    period: &str,
    creator: &str,
    volume: &str,
    default_period: Option<Period>,
    latest: Period,
) -> Result<Row, FieldError> {
    let period = if period.is_empty() {
        default_period.ok_or_else(|| FieldError::new("period", "is missing (give it in the file or with --period)"))?
    } else {
        let p = Period::parse(period).map_err(|e| FieldError::new("period", e))?;
        if let Some(expected) = default_period {
            if p != expected {
                return Err(FieldError::new("period", format!("is {p}, but --period is {expected}")));
            }
        }
        p
    };
    if period > latest {
        return Err(FieldError::new("period", format!("{period} is in the future")));
    }
    let creator = CreatorAddress::parse(creator).map_err(|e| FieldError::new("creator", e.to_string()))?;
    let volume = Amount::parse_decimal(volume).map_err(|e| FieldError::new("volume", e.to_string()))?;
    Ok(Row {
        period,
        creator,
        volume,
    })
}

/// Parses a CSV data line.
pub fn parse_csv(
    line: &str,
    columns: Columns,
    default_period: Option<Period>,
    latest: Period,
) -> Result<Row, FieldError> {
    let fields: Vec<&str> = line.split(',').collect();
    let want = match columns {
        Columns::PeriodCreatorVolume => 3,
        Columns::CreatorVolume => 2,
    };
    if fields.len() != want {
        return Err(FieldError::new(
            "line",
            format!(
                "has {} fields, expected {want} ({})",
                fields.len(),
                match columns {
                    Columns::PeriodCreatorVolume => "period,creator,volume",
                    Columns::CreatorVolume => "creator,volume",
                }
            ),
        ));
    }
    let get = |i: usize, name: &'static str| unquote(fields[i]).map_err(|r| FieldError::new(name, r));
    let (period, creator, volume) = match columns {
        Columns::PeriodCreatorVolume => (get(0, "period")?, get(1, "creator")?, get(2, "volume")?),
        Columns::CreatorVolume => ("", get(0, "creator")?, get(1, "volume")?),
    };
    validate(period, creator, volume, default_period, latest)
}

/// Parses a JSON Lines line. `volume` may be a string of digits, or a JSON
/// integer up to 2^53 (larger JSON numbers are not exact in most producers).
pub fn parse_jsonl(line: &str, default_period: Option<Period>, latest: Period) -> Result<Row, FieldError> {
    const FIELDS: [&str; 3] = ["period", "creator", "volume"];
    let unknown = |name: &str| FieldError::new("line", format!("has an unknown field {name:?}"));
    let object = crate::json::parse_object(line.as_bytes()).map_err(|e| match e {
        ObjectError::Syntax(e) => FieldError::new("line", format!("is not valid JSON: {e}")),
        ObjectError::NotAnObject => FieldError::new("line", "is not a JSON object"),
        ObjectError::Duplicate(name) => match FIELDS.iter().find(|f| **f == name) {
            Some(field) => FieldError::new(field, "is given more than once"),
            None => unknown(&name),
        },
    })?;
    if let Some(name) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(unknown(name));
    }
    let text = |name: &'static str| -> Result<Option<&str>, FieldError> {
        match object.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(FieldError::new(name, "must be a string")),
        }
    };
    let period = text("period")?.unwrap_or("");
    let creator = text("creator")?.ok_or_else(|| FieldError::new("creator", "is missing"))?;
    let volume_number;
    let volume = match object.get("volume") {
        Some(serde_json::Value::String(s)) => s.as_str(),
        Some(serde_json::Value::Number(n)) => match n.as_u64().filter(|v| *v <= 1 << 53) {
            Some(v) => {
                volume_number = v.to_string();
                volume_number.as_str()
            }
            None => {
                return Err(FieldError::new(
                    "volume",
                    "as a JSON number must be a whole number from 0 to 2^53; write larger volumes as strings",
                ))
            }
        },
        None | Some(serde_json::Value::Null) => return Err(FieldError::new("volume", "is missing")),
        Some(_) => return Err(FieldError::new("volume", "must be a string of digits")),
    };
    validate(period, creator, volume, default_period, latest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn latest() -> Period {
        Period::parse("2026-11-29").unwrap()
    }

    const A: &str = "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed";

    #[test]
    fn csv_rows_and_their_errors() {
        let cols = Columns::PeriodCreatorVolume;
        let row = parse_csv(&format!("2026-11-28,{A},1000"), cols, None, latest()).unwrap();
        assert_eq!(row.volume.to_string(), "1000");
        let row = parse_csv(
            &format!(
                "\"2026-11-28\",\"{}\",\"7\"",
                "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
            ),
            cols,
            None,
            latest(),
        )
        .unwrap();
        assert_eq!(row.creator.as_str(), A);
        let err = |line: &str| parse_csv(line, cols, None, latest()).unwrap_err();
        assert_eq!(err(&format!("2026-11-28,{A},-1")).field, "volume");
        assert_eq!(err(&format!("2026-11-28,{A},1.5")).field, "volume");
        assert_eq!(err(&format!("2026-11-28,{A},1e3")).field, "volume");
        assert_eq!(err(&format!("2026-11-28,{A},+1")).field, "volume");
        assert_eq!(err(&format!("2026-02-30,{A},1")).field, "period");
        assert_eq!(err(&format!("2026-11-30,{A},1")).field, "period");
        assert_eq!(
            err("2026-11-28,0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD,1").field,
            "creator"
        );
        assert_eq!(err("2026-11-28,0x12,1").field, "creator");
        assert_eq!(err(&format!("2026-11-28,{A}")).field, "line");
        assert_eq!(err(&format!("2026-11-28,\"{A},1")).field, "creator");
    }

    #[test]
    fn headers_and_jsonl() {
        assert_eq!(csv_header("period,creator,volume"), Some(Columns::PeriodCreatorVolume));
        assert_eq!(csv_header(" Creator , Volume "), Some(Columns::CreatorVolume));
        assert_eq!(csv_header(&format!("2026-11-28,{A},1")), None);
        let p = Some(Period::parse("2026-11-28").unwrap());
        assert!(parse_jsonl(&format!(r#"{{"creator":"{A}","volume":"5"}}"#), p, latest()).is_ok());
        assert!(parse_jsonl(&format!(r#"{{"creator":"{A}","volume":5}}"#), p, latest()).is_ok());
        assert_eq!(
            parse_jsonl(&format!(r#"{{"creator":"{A}","volume":1e30}}"#), p, latest())
                .unwrap_err()
                .field,
            "volume"
        );
        assert_eq!(
            parse_jsonl(&format!(r#"{{"creator":"{A}","volume":"5","x":1}}"#), p, latest())
                .unwrap_err()
                .field,
            "line"
        );
        assert_eq!(parse_jsonl("[1]", p, latest()).unwrap_err().field, "line");
        assert_eq!(
            parse_jsonl(&format!(r#"{{"creator":"{A}"}}"#), p, latest())
                .unwrap_err()
                .field,
            "volume"
        );
        assert_eq!(
            parse_jsonl(
                &format!(r#"{{"period":"2026-11-27","creator":"{A}","volume":"1"}}"#),
                p,
                latest()
            )
            .unwrap_err()
            .field,
            "period"
        );
    }

    #[test]
    fn a_jsonl_field_given_twice_is_refused_naming_it_not_the_last_taken() {
        let p = Some(Period::parse("2026-11-28").unwrap());
        let err = |line: String| parse_jsonl(&line, p, latest()).unwrap_err();
        let twice = err(format!(r#"{{"creator":"{A}","volume":"1","volume":"7"}}"#));
        assert_eq!(
            (twice.field, twice.reason.as_str()),
            ("volume", "is given more than once")
        );
        assert_eq!(
            err(format!(r#"{{"creator":"{A}","creator":"{A}","volume":"1"}}"#)).field,
            "creator"
        );
        let unknown = err(format!(r#"{{"creator":"{A}","volume":"1","x":1,"x":2}}"#));
        assert_eq!(
            (unknown.field, unknown.reason.as_str()),
            ("line", "has an unknown field \"x\"")
        );
    }

    proptest! {
        #[test]
        fn the_row_parsers_never_panic(line in "\\PC{0,200}") {
            let _ = parse_csv(&line, Columns::PeriodCreatorVolume, None, latest());
            let _ = parse_csv(&line, Columns::CreatorVolume, Some(latest()), latest());
            let _ = parse_jsonl(&line, None, latest());
            let _ = csv_header(&line);
        }

        #[test]
        fn valid_rows_round_trip(bytes in any::<[u8; 20]>(), volume in any::<u128>(), day in 1u32..=28) {
            let creator: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let line = format!("2026-11-{day:02},0x{creator},{volume}");
            let row = parse_csv(&line, Columns::PeriodCreatorVolume, None, latest()).unwrap();
            prop_assert_eq!(format!("{},{},{}", row.period, row.creator, row.volume), line.clone());
            let json = format!(r#"{{"period":"{}","creator":"{}","volume":"{}"}}"#, row.period, row.creator, row.volume);
            prop_assert_eq!(parse_jsonl(&json, None, latest()).unwrap(), row);
        }
    }
}
