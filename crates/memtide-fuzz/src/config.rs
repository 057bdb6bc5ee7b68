//! The configuration file (TOML): what parses and passes the checks converts to the
//! daemon's settings.

use memtide::config::Config;

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text, "fuzz.toml") {
        Ok(config) => {
            config.settings().expect("a checked configuration converts");
            config.call_timeout();
            config.policy_source();
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
