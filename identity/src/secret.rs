//! Secrets compared and made: bearer tokens (Identity's token files, the dashboard's per-run
//! token) are checked without revealing how much of a guess was right, and made from the crypto
//! provider's CSPRNG.

/// Compares without an early exit, so that the time taken does not reveal how much of a guess
/// was right. Lengths are not secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// `bytes` random bytes from the provider's CSPRNG, as lowercase hex: a token that fits a URL, a
/// header and a cookie unescaped.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    crate::tls::random(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_secrets_compare_equal_and_any_difference_or_length_does_not() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn random_tokens_are_hex_of_the_asked_length_and_differ() {
        let (a, b) = (random_hex(32), random_hex(32));
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
