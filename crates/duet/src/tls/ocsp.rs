//! The OCSP response a certificate staples (RFC 6960), as an outside tool (`openssl ocsp`, certbot,
//! a cron job) wrote it: checked that it is one and `successful`, and read for when it goes stale.
//! Its signature is the client's to check, as with nginx's `ssl_stapling_file`. A few DER fields are
//! walked by hand rather than through an ASN.1 crate: the path to `nextUpdate` is fixed, and
//! x509-parser, which duet links, parses certificates, not OCSP responses.

use std::io::Read;

/// The most of an OCSP response read (they are a few KiB).
const MAX_OCSP: u64 = 64 * 1024;

/// The response in `path`: refused unless its status is `successful`, since a `tryLater` or cut-off
/// file stapled would make strict clients fail every handshake.
pub(crate) fn response(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_OCSP + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the OCSP response: {e}"))?;
    if bytes.len() as u64 > MAX_OCSP {
        return Err(format!("an OCSP response over {MAX_OCSP} bytes"));
    }
    match status(&bytes) {
        Some(0) => Ok(bytes),
        Some(status) => Err(format!(
            "an OCSP response with status {status}, not successful (0)"
        )),
        None => Err("not a DER OCSP response".to_owned()),
    }
}

/// The `responseStatus` of a DER `OCSPResponse`: `SEQUENCE { ENUMERATED, [0] ... }`, whose
/// length covers the rest of the bytes.
fn status(bytes: &[u8]) -> Option<u8> {
    let (response, rest) = element(bytes, 0x30)?;
    if !rest.is_empty() {
        return None;
    }
    match element(response, 0x0a)? {
        ([status], _) => Some(*status),
        _ => None,
    }
}

/// When a `successful` response goes stale: the earliest `nextUpdate` of its single responses, in
/// seconds since the Unix epoch. `None` when it names none (it is then never stale, RFC 6960 §4.2.2.1)
/// or cannot be read that far.
pub(crate) fn next_update(bytes: &[u8]) -> Option<i64> {
    // OCSPResponse ::= SEQUENCE { responseStatus, responseBytes [0] EXPLICIT ResponseBytes }
    let (response, _) = element(bytes, 0x30)?;
    let (_, response) = element(response, 0x0a)?;
    let (explicit, _) = element(response, 0xa0)?;
    // ResponseBytes ::= SEQUENCE { responseType OID, response OCTET STRING (BasicOCSPResponse) }
    let (response_bytes, _) = element(explicit, 0x30)?;
    let (_, response_bytes) = element(response_bytes, 0x06)?;
    let (basic, _) = element(response_bytes, 0x04)?;
    // BasicOCSPResponse ::= SEQUENCE { tbsResponseData ResponseData, ... }
    let (basic, _) = element(basic, 0x30)?;
    let (data, _) = element(basic, 0x30)?;
    // ResponseData ::= SEQUENCE { version [0] OPTIONAL, responderID ([1] or [2]), producedAt,
    //                             responses SEQUENCE OF SingleResponse, ... }
    let data = skip_optional(data, 0xa0)?;
    let (_, data) = any_element(data)?;
    let (_, data) = element(data, 0x18)?;
    let (mut responses, _) = element(data, 0x30)?;
    let mut earliest: Option<i64> = None;
    while !responses.is_empty() {
        let (single, rest) = element(responses, 0x30)?;
        responses = rest;
        // SingleResponse ::= SEQUENCE { certID, certStatus, thisUpdate, nextUpdate [0] OPTIONAL, ... }
        let (_, single) = element(single, 0x30)?;
        let (_, single) = any_element(single)?;
        let (_, single) = element(single, 0x18)?;
        let Some((explicit, _)) = element(single, 0xa0) else {
            continue;
        };
        let (time, _) = element(explicit, 0x18)?;
        let at = generalized_time(time)?;
        earliest = Some(earliest.map_or(at, |e| e.min(at)));
    }
    earliest
}

/// The content of the DER element at the start of `bytes` if its tag is `tag`, and what follows it.
fn element(bytes: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    match any_element(bytes)? {
        ((found, content), rest) if found == tag => Some((content, rest)),
        _ => None,
    }
}

/// `bytes` after an element tagged `tag`, if one is first.
fn skip_optional(bytes: &[u8], tag: u8) -> Option<&[u8]> {
    match element(bytes, tag) {
        Some((_, rest)) => Some(rest),
        None => Some(bytes),
    }
}

/// The tag and content of the DER element at the start of `bytes` (definite length, short or long
/// form up to 4 bytes), and what follows it.
#[allow(clippy::type_complexity)]
fn any_element(bytes: &[u8]) -> Option<((u8, &[u8]), &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81..=0x84 => {
            let count = usize::from(first & 0x7f);
            let (digits, rest) = rest.split_at_checked(count)?;
            let length = digits
                .iter()
                .fold(0usize, |n, &d| (n << 8) | usize::from(d));
            (length, rest)
        }
        _ => return None,
    };
    let (content, rest) = rest.split_at_checked(length)?;
    Some(((tag, content), rest))
}

/// A DER `GeneralizedTime` (`YYYYMMDDHHMMSSZ`, RFC 5280 §4.1.2.5.2) in seconds since the Unix epoch.
fn generalized_time(text: &[u8]) -> Option<i64> {
    let [y0, y1, y2, y3, mo0, mo1, d0, d1, h0, h1, mi0, mi1, s0, s1, b'Z'] = *text else {
        return None;
    };
    let number = |digits: &[u8]| {
        digits.iter().try_fold(0i64, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
        })
    };
    let (year, month, day) = (
        number(&[y0, y1, y2, y3])?,
        number(&[mo0, mo1])?,
        number(&[d0, d1])?,
    );
    let (hour, minute, second) = (number(&[h0, h1])?, number(&[mi0, mi1])?, number(&[s0, s1])?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    Some(days_since_epoch(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second.min(60))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ocsp_response_s_status_is_read_from_its_der_and_anything_else_is_refused() {
        // `successful`, with (made-up) response bytes after it; short and long length forms.
        assert_eq!(status(&[0x30, 0x05, 0x0a, 0x01, 0x00, 0xa0, 0x00]), Some(0));
        let mut long = vec![0x30, 0x82, 0x01, 0x03, 0x0a, 0x01, 0x00, 0xa0, 0x81, 0xfc];
        long.extend([0u8; 0xfd]);
        assert_eq!(status(&long), Some(0));
        // `tryLater` (3), as a responder answers when it cannot.
        assert_eq!(status(&[0x30, 0x03, 0x0a, 0x01, 0x03]), Some(3));
        // Cut short, not a SEQUENCE, empty, PEM.
        assert_eq!(status(&long[..100]), None);
        assert_eq!(status(&[0x31, 0x03, 0x0a, 0x01, 0x00]), None);
        assert_eq!(status(&[]), None);
        assert_eq!(status(b"-----BEGIN"), None);
    }

    #[test]
    fn next_update_is_read_from_a_response_openssl_made() {
        // `openssl ocsp -index ... -ndays 7`; `openssl ocsp -respin F -resp_text` says
        // "Next Update: Dec 12 17:20:57 2026 GMT".
        let dated =
            include_bytes!("../../../../tests/fixtures/ocsp/next-update-2026-12-12T17-20-57Z.der");
        assert_eq!(status(dated), Some(0));
        assert_eq!(next_update(dated), Some(1_797_096_057));
        // Without `-ndays` openssl writes no nextUpdate: never stale.
        let undated = include_bytes!("../../../../tests/fixtures/ocsp/no-next-update.der");
        assert_eq!(status(undated), Some(0));
        assert_eq!(next_update(undated), None);
        // Cut anywhere, it is unreadable rather than misread.
        for cut in 0..dated.len() {
            assert_eq!(next_update(&dated[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn generalized_times_are_seconds_since_the_epoch() {
        assert_eq!(generalized_time(b"19700101000000Z"), Some(0));
        assert_eq!(generalized_time(b"20000229235959Z"), Some(951_868_799));
        assert_eq!(generalized_time(b"20261212172057Z"), Some(1_797_096_057));
        assert_eq!(generalized_time(b"20261312172057Z"), None);
        assert_eq!(generalized_time(b"20261212172057"), None);
        assert_eq!(generalized_time(b"2026121217205Z7"), None);
    }
}
