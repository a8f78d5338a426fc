//! The request path as authorization sees it, normalized the way the app's server will read it,
//! so that `/admin` cannot be reached as `/%61dmin`, `/public/../admin` or `//admin` past a rule
//! on `/admin`. The proxy then forwards the normalized path (as Istio's path normalization does),
//! so the policy and the app cannot disagree on what was asked for.
//!
//! Normalization (only for paths starting with `/`; `*` and CONNECT's empty path are left alone):
//! 1. percent-encoded unreserved characters (RFC 3986 §2.3: `A-Z a-z 0-9 - . _ ~`) are decoded;
//!    other escapes are kept, with upper-case hex (`%2a` → `%2A`);
//! 2. empty segments are merged (`//` → `/`);
//! 3. dot segments are removed (RFC 3986 §5.2.4: `/a/./b` → `/a/b`, `/a/b/../c` → `/a/c`).
//!
//! Paths whose meaning depends on the server are refused (400) rather than guessed: an encoded
//! `/` or `\` (`%2F`, `%5C`: one server splits on it, another does not), a literal `\` (a segment
//! separator on some servers), a malformed escape, and `..` climbing above the root.
//!
//! A path that needs none of this (nearly every request) is returned borrowed, without allocating.

use std::borrow::Cow;

/// Why a path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    #[error("an encoded '/' or '\\' (%2F, %5C) in the path")]
    EncodedSeparator,
    #[error("a '\\' in the path")]
    Backslash,
    #[error("a malformed percent-escape in the path")]
    BadEscape,
    #[error("a '..' segment above the root of the path")]
    AboveRoot,
}

/// The normalized form of `path` (see the module documentation).
pub fn normalize(path: &str) -> Result<Cow<'_, str>, Ambiguous> {
    if !path.starts_with('/') || is_normal(path.as_bytes())? {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path.as_bytes())?;
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    // Start offsets in `out` of each segment written, to pop on `..`.
    let mut starts: Vec<usize> = Vec::new();
    // The input always starts with '/': segments follow each '/'.
    let mut segments = decoded[1..].split(|b| *b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            b"" | b"." => {}
            b".." => {
                let start = starts.pop().ok_or(Ambiguous::AboveRoot)?;
                out.truncate(start);
            }
            _ => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(segment);
                continue;
            }
        }
        // An empty or dot segment at the end leaves a directory: keep its trailing slash.
        if last {
            out.push(b'/');
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    // Only ASCII was decoded or added; everything else is copied whole.
    String::from_utf8(out).map(Cow::Owned).map_err(|_| Ambiguous::BadEscape)
}

/// Whether `path` is already normal (no escape but canonical ones, no empty or dot segment);
/// errors found on the way are returned at once.
fn is_normal(path: &[u8]) -> Result<bool, Ambiguous> {
    let mut normal = true;
    for (i, b) in path.iter().enumerate() {
        match b {
            b'\\' => return Err(Ambiguous::Backslash),
            b'%' => {
                let (hi, lo) = (path.get(i + 1).copied(), path.get(i + 2).copied());
                let byte = match (hi.and_then(hex), lo.and_then(hex)) {
                    (Some(hi), Some(lo)) => hi << 4 | lo,
                    _ => return Err(Ambiguous::BadEscape),
                };
                if byte == b'/' || byte == b'\\' {
                    return Err(Ambiguous::EncodedSeparator);
                }
                // Already canonical: an escape that must stay one, in upper-case hex.
                let upper = |b: Option<u8>| b.is_some_and(|b| !b.is_ascii_lowercase());
                if unreserved(byte) || !upper(hi) || !upper(lo) {
                    normal = false;
                }
            }
            b'/' => {
                let rest = &path[i + 1..];
                let segment = rest.split(|b| *b == b'/').next().unwrap_or_default();
                // An empty segment that is not the trailing slash, or a dot segment.
                if (segment.is_empty() && !rest.is_empty()) || segment == b"." || segment == b".." {
                    normal = false;
                }
            }
            _ => {}
        }
    }
    Ok(normal)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Step 1: unreserved characters decoded, other escapes upper-cased.
fn decode(path: &[u8]) -> Result<Vec<u8>, Ambiguous> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'\\' => return Err(Ambiguous::Backslash),
            b'%' => {
                let (hi, lo) = match (path.get(i + 1).copied().and_then(hex), path.get(i + 2).copied().and_then(hex)) {
                    (Some(hi), Some(lo)) => (hi, lo),
                    _ => return Err(Ambiguous::BadEscape),
                };
                let byte = hi << 4 | lo;
                if byte == b'/' || byte == b'\\' {
                    return Err(Ambiguous::EncodedSeparator);
                }
                if unreserved(byte) {
                    out.push(byte);
                } else {
                    out.extend_from_slice(&[b'%', HEX[usize::from(hi)], HEX[usize::from(lo)]]);
                }
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(path: &str) -> Result<String, Ambiguous> {
        normalize(path).map(Cow::into_owned)
    }

    #[test]
    fn ordinary_paths_are_borrowed() {
        for path in ["/", "/admin", "/a/b/", "/a.b/c..d/.e", "/api/v1/x_y~z", "*", "", "/a.", "/..a", "/sp%20ace%3F"] {
            assert!(matches!(normalize(path), Ok(Cow::Borrowed(p)) if p == path), "{path}");
        }
    }

    #[test]
    fn the_app_and_the_policy_see_the_same_path() {
        for (given, normal) in [
            ("/%61dmin", "/admin"),
            ("/a/%2e%2e/x", "/x"),
            ("/public/%2E%2E/admin", "/admin"),
            ("/public/../admin", "/admin"),
            ("//admin", "/admin"),
            ("/a//b///c", "/a/b/c"),
            ("/a/./b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/a/b/../", "/a/"),
            ("/a/%7euser", "/a/~user"),
            ("/q%3fx", "/q%3Fx"),
            ("/sp%20ace", "/sp%20ace"),
            ("/%25%32%65", "/%252e"),
            ("/.", "/"),
            ("/a/..", "/"),
            ("//", "/"),
        ] {
            assert_eq!(n(given).as_deref(), Ok(normal), "{given}");
            assert_eq!(n(normal).as_deref(), Ok(normal), "idempotent: {normal}");
        }
    }

    #[test]
    fn paths_servers_disagree_on_are_refused() {
        for (path, why) in [
            ("/admin%2fx", Ambiguous::EncodedSeparator),
            ("/public%2F..%2Fadmin", Ambiguous::EncodedSeparator),
            ("/a%5cb", Ambiguous::EncodedSeparator),
            ("/a\\b", Ambiguous::Backslash),
            ("/a%2", Ambiguous::BadEscape),
            ("/a%zz", Ambiguous::BadEscape),
            ("/..", Ambiguous::AboveRoot),
            ("/a/../../admin", Ambiguous::AboveRoot),
            ("/%2e%2e", Ambiguous::AboveRoot),
        ] {
            assert_eq!(n(path), Err(why), "{path}");
        }
    }

    /// The fuzz target's oracles (fuzz/fuzz_targets/proxy_authz_path.rs), exhaustively over
    /// every path of up to 6 characters from the alphabet that matters here.
    #[test]
    fn normalization_is_idempotent_and_leaves_no_dot_or_empty_segment() {
        const ALPHABET: &[u8] = b"/.%2eEfa";
        let mut path = Vec::new();
        for len in 0..=6u32 {
            for mut n in 0..ALPHABET.len().pow(len) {
                path.clear();
                path.push(b'/');
                for _ in 0..len {
                    path.push(ALPHABET[n % ALPHABET.len()]);
                    n /= ALPHABET.len();
                }
                let path = std::str::from_utf8(&path).unwrap();
                let Ok(normal) = normalize(path) else { continue };
                for bad in ["//", "/./", "/../"] {
                    assert!(!normal.contains(bad), "{path} -> {normal}");
                }
                assert!(!normal.ends_with("/.") && !normal.ends_with("/.."), "{path} -> {normal}");
                assert!(
                    matches!(normalize(&normal), Ok(Cow::Borrowed(again)) if again == normal),
                    "{path} -> {normal}"
                );
            }
        }
    }
}
