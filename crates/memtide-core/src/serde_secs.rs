//! Serialize a `Duration` as fractional seconds, the way recordings and APIs show time.

use serde::{Deserialize, Deserializer, Serializer};
use std::time::Duration;

/// Write the duration as seconds (a float).
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Read seconds (a non-negative, finite float) as a duration.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let secs = f64::deserialize(d)?;
    Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
}
