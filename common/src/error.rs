//! Errors in one line with their causes. Libraries (tonic, kube, hyper) often say only
//! `transport error` at the top and keep what happened (resolution, connect, TLS) in the source
//! chain; an operator reading a log line needs the chain.

use std::error::Error;

/// `text`, then every cause in `error`'s source chain whose message `text` does not already
/// hold, each after `: `.
pub fn with_causes(mut text: String, error: &dyn Error) -> String {
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    #[test]
    fn causes_are_appended_once() {
        let refused = Layer("Connection refused", None);
        let connect = Layer("connecting to a:1: Connection refused", Some(Box::new(refused)));
        let top = Layer("transport error", Some(Box::new(connect)));
        assert_eq!(with_causes("Unavailable".into(), &top), "Unavailable: connecting to a:1: Connection refused");
        assert_eq!(with_causes("x".into(), &Layer("alone", None)), "x");
    }
}
