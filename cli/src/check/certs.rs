//! Pure certificate checks over PEM text: parsing, validity windows against a given `now`, and
//! "is this certificate signed by that CA" (names compared byte for byte, signature verified).
//! No clock is read here so that tests and golden files can fix time.
//!
//! Layer: runtime (operator CLI), pure helpers.

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use super::report::Status;

/// Certificates expiring sooner than this fail: there is barely time to rotate.
pub const FAIL_WITHIN_SECS: i64 = 7 * 86400;
/// Certificates expiring sooner than this warn: plan the rotation.
pub const WARN_WITHIN_SECS: i64 = 60 * 86400;

/// The DER certificates of a PEM bundle, in order; an error if there are none or one is broken.
pub fn parse_pem(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut ders = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| format!("invalid PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        X509Certificate::from_der(&block.contents).map_err(|e| format!("invalid certificate: {e}"))?;
        ders.push(block.contents);
    }
    if ders.is_empty() {
        return Err("no certificate in the PEM data".to_string());
    }
    Ok(ders)
}

pub fn parse(der: &[u8]) -> X509Certificate<'_> {
    // Every DER handled here came out of `parse_pem`, which parsed it once already.
    X509Certificate::from_der(der).expect("parse_pem validated the certificate").1
}

pub fn subject(der: &[u8]) -> String {
    parse(der).subject().to_string()
}

/// `cert` names `ca` as its issuer and `ca`'s key verifies its signature.
pub fn signed_by(cert: &[u8], ca: &[u8]) -> bool {
    let (cert, ca) = (parse(cert), parse(ca));
    cert.issuer().as_raw() == ca.subject().as_raw() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// The serial number as colon-separated hex: what tells two issuers of the same subject apart
/// (the proxy's `/identity.json` reports its issuer's the same way).
pub fn serial(der: &[u8]) -> String {
    parse(der).raw_serial_as_string()
}

/// The DNS subject alternative names.
pub fn dns_names(der: &[u8]) -> Vec<String> {
    let cert = parse(der);
    let Ok(Some(san)) = cert.subject_alternative_name() else { return Vec::new() };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            _ => None,
        })
        .collect()
}

/// Seconds since the Unix epoch at which the certificate stops being valid.
pub fn not_after(der: &[u8]) -> i64 {
    parse(der).validity().not_after.timestamp()
}

/// Fail if expired, not yet valid or expiring within 7 days; warn within 60 days; otherwise ok.
/// The message names the expiry date (UTC) and how far away it is.
pub fn validity(der: &[u8], now: i64) -> (Status, String) {
    let cert = parse(der);
    let (not_before, not_after) = (cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp());
    if now < not_before {
        return (Status::Fail, format!("not valid before {}", format_time(not_before)));
    }
    if now >= not_after {
        return (Status::Fail, format!("expired on {}", format_time(not_after)));
    }
    let left = not_after - now;
    let message = format!("expires {} (in {})", format_date(not_after), format_duration(left));
    let status = if left < FAIL_WITHIN_SECS {
        Status::Fail
    } else if left < WARN_WITHIN_SECS {
        Status::Warn
    } else {
        Status::Ok
    };
    (status, message)
}

/// "364 days", "1 day", "5 hours": coarse on purpose, this is about planning a rotation.
pub fn format_duration(secs: i64) -> String {
    let plural = |n: i64, unit: &str| if n == 1 { format!("1 {unit}") } else { format!("{n} {unit}s") };
    if secs >= 86400 {
        plural(secs / 86400, "day")
    } else if secs >= 3600 {
        plural(secs / 3600, "hour")
    } else {
        plural(secs.max(0) / 60, "minute")
    }
}

/// `YYYY-MM-DD` (UTC) of a Unix timestamp.
pub fn format_date(unix: i64) -> String {
    let (y, m, d) = civil_from_days(unix.div_euclid(86400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix timestamp.
pub fn format_time(unix: i64) -> String {
    let secs = unix.rem_euclid(86400);
    format!("{} {:02}:{:02}:{:02} UTC", format_date(unix), secs / 3600, secs / 60 % 60, secs % 60)
}

/// Howard Hinnant's days-to-civil: the proleptic Gregorian date of a day count from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_and_deterministic() {
        assert_eq!(format_date(0), "1970-01-01");
        assert_eq!(format_date(951_782_400), "2000-02-29");
        assert_eq!(format_time(1_795_000_000), "2026-11-18 11:06:40 UTC");
        assert_eq!(format_date(-86400), "1969-12-31");
    }

    #[test]
    fn durations_are_coarse() {
        assert_eq!(format_duration(86400 * 364 + 5), "364 days");
        assert_eq!(format_duration(86400), "1 day");
        assert_eq!(format_duration(7200), "2 hours");
        assert_eq!(format_duration(59), "0 minutes");
    }

    #[test]
    fn pem_without_certificates_is_an_error() {
        assert!(parse_pem(b"").is_err());
        assert!(parse_pem(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err());
    }
}
