//! The CSV and JSONL row parsers never panic, whatever the line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use settled::import::parse::{csv_header, parse_csv, parse_jsonl, Columns};
use settled::period::Period;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        let latest = Period::parse("2026-11-29").unwrap();
        let _ = csv_header(line);
        if let Ok(row) = parse_csv(line, Columns::PeriodCreatorVolume, None, latest) {
            assert!(row.period <= latest);
        }
        let _ = parse_csv(line, Columns::CreatorVolume, Some(latest), latest);
        let _ = parse_jsonl(line, None, latest);
    }
});
