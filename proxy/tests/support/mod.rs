//! What several in-process test files share.

use cnimesh_proxy::admin::LogLevel;

/// A log filter for an in-process admin server: shown, never changed.
pub struct FixedLevel;

impl LogLevel for FixedLevel {
    fn get(&self) -> String {
        "info".into()
    }
    fn set(&self, _: &str) -> Result<(), String> {
        Ok(())
    }
}
