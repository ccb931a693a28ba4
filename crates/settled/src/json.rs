//! JSON objects read strictly, for every JSON the product reads from
//! outside (API bodies, JSONL import lines): a member named twice in one
//! object is an error naming it, never "the last one wins" (serde_json's
//! `Value` keeps the last, so `{"amount":"1","amount":"7"}` would pay 7).

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why a text is not a JSON object this product accepts.
#[derive(Debug)]
pub(crate) enum ObjectError {
    /// Not JSON (or text after it).
    Syntax(serde_json::Error),
    /// JSON, but not an object.
    NotAnObject,
    /// A member appears twice in one object: its path (`amount`, `a.b`, `a[0].b`).
    Duplicate(String),
}

/// Parses `text` as one JSON object whose objects, at every depth, name
/// each member once.
pub(crate) fn parse_object(text: &[u8]) -> Result<Map<String, Value>, ObjectError> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(text);
    let parsed = Strict {
        path: String::new(),
        duplicate: &duplicate,
    }
    .deserialize(&mut de)
    .and_then(|value| de.end().map(|()| value));
    match (parsed, duplicate.into_inner()) {
        (_, Some(path)) => Err(ObjectError::Duplicate(path)),
        (Err(e), None) => Err(ObjectError::Syntax(e)),
        (Ok(Value::Object(object)), None) => Ok(object),
        (Ok(_), None) => Err(ObjectError::NotAnObject),
    }
}

/// Builds a `Value` as serde_json's own does, but stops at the first
/// member named twice, keeping its path in `duplicate`.
struct Strict<'a> {
    path: String,
    duplicate: &'a RefCell<Option<String>>,
}

impl<'a> Strict<'a> {
    fn child(&self, step: String) -> Strict<'a> {
        Strict {
            path: step,
            duplicate: self.duplicate,
        }
    }

    fn member(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.child(format!("{}[{}]", self.path, items.len())))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = self.member(&key);
            if object.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(path);
                return Err(de::Error::custom("a member appears twice"));
            }
            let value = map.next_value_seed(self.child(path))?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_object, ObjectError};

    fn duplicate(text: &str) -> Option<String> {
        match parse_object(text.as_bytes()) {
            Err(ObjectError::Duplicate(path)) => Some(path),
            _ => None,
        }
    }

    #[test]
    fn a_member_named_twice_at_any_depth_is_named_by_its_path() {
        assert_eq!(duplicate(r#"{"amount":"1","amount":"7"}"#).as_deref(), Some("amount"));
        assert_eq!(duplicate(r#"{"a":{"b":1,"c":2,"b":3}}"#).as_deref(), Some("a.b"));
        assert_eq!(duplicate(r#"{"a":[{"b":1},{"b":1,"b":2}]}"#).as_deref(), Some("a[1].b"));
        // The same name in different objects is no duplicate; escapes are
        // compared after decoding.
        assert_eq!(duplicate(r#"{"a":{"b":1},"c":{"b":1}}"#), None);
        assert_eq!(duplicate(r#"{"amount":1,"\u0061mount":2}"#).as_deref(), Some("amount"));
    }

    #[test]
    fn objects_parse_as_serde_json_parses_them_and_anything_else_is_refused() {
        let text = r#"{"s":"x","n":-5,"u":18446744073709551615,"f":1.5,"t":true,"z":null,"a":[1,{"b":[]}]}"#;
        let strict = parse_object(text.as_bytes()).unwrap();
        let plain: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::Value::Object(strict), plain);
        assert!(matches!(parse_object(b"[1]"), Err(ObjectError::NotAnObject)));
        assert!(matches!(parse_object(b"\"s\""), Err(ObjectError::NotAnObject)));
        for bad in [&b"{"[..], b"{} {}", b"", b"{\"a\":}"] {
            assert!(matches!(parse_object(bad), Err(ObjectError::Syntax(_))), "{bad:?}");
        }
    }
}
