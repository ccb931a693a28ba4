//! A settlement period: one calendar date.

use std::fmt;
use std::str::FromStr;

use chrono::NaiveDate;

/// A period (a date, `YYYY-MM-DD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period(NaiveDate);

impl Period {
    /// Parses `YYYY-MM-DD`.
    pub fn parse(text: &str) -> Result<Period, String> {
        NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .ok()
            .filter(|_| text.len() == 10)
            .map(Period)
            .ok_or_else(|| format!("period must be a date written YYYY-MM-DD, got {text:?}"))
    }

    /// The date.
    pub fn date(self) -> NaiveDate {
        self.0
    }

    /// From a date.
    pub fn from_date(date: NaiveDate) -> Period {
        Period(date)
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%d"))
    }
}

impl FromStr for Period {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Period::parse(s)
    }
}
