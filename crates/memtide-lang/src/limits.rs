//! Bounds on one evaluation, so that no policy can hang or exhaust memory.

use serde::{Deserialize, Serialize};

/// Bounds on one evaluation; exceeding one is a policy error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Steps allowed: one per expression evaluated, plus one per 64 units of the
    /// sizes of a built-in's arguments and result.
    pub max_steps: u64,
    /// Deepest nesting of evaluation (expressions within expressions, function calls
    /// within function calls), and of the lists it builds (lists within lists). Each level
    /// of evaluation takes up to about 4.5 KiB of Rust stack unoptimized, 0.5 KiB
    /// optimized: the default fits in a 2 MiB thread stack.
    pub max_depth: usize,
    /// Largest string or list a policy may build (see [`crate::Value::size`]).
    pub max_value_size: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_steps: 1_000_000,
            max_depth: 200,
            max_value_size: 1 << 20,
        }
    }
}
