//! `access_log:`: its format, fields and success sample as read, and each mistake located.

use duet_config::{parse, LogField, LogFormat};

mod support;
use support::{errors, with_routes, BASE};

#[test]
fn the_default_is_today_s_line_and_a_chosen_list_keeps_its_order() {
    let config = parse(BASE, "ok.yaml").expect("valid");
    assert_eq!(config.access_log.format, None);
    assert_eq!(config.access_log.fields, LogField::DEFAULT);
    assert_eq!(config.access_log.sample_success, 1.0);
    let yaml = format!(
        "{BASE}access_log:\n  format: json\n  fields: [sni, status, query, user, connect_ms]\n  \
         sample_success: 2.5%\n"
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    assert_eq!(config.access_log.format, Some(LogFormat::Json));
    assert_eq!(
        config.access_log.fields,
        [
            LogField::Sni,
            LogField::Status,
            LogField::Query,
            LogField::User,
            LogField::ConnectMs
        ]
    );
    assert_eq!(config.access_log.sample_success, 0.025);
}

#[test]
fn an_unknown_or_repeated_field_a_bad_format_and_a_bad_sample_are_located() {
    let yaml = format!(
        "{BASE}access_log:\n  format: yaml\n  fields: [status, referrer, status]\n  \
         sample_success: 150%\n  colour: true\n"
    );
    let found = errors(&yaml);
    assert_eq!(found.len(), 5, "{found:#?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:7:11: access_log.format: unknown format `yaml`: expected `text`, `json` or `combined`"
        ),
        "{found:#?}"
    );
    assert!(
        found[1].starts_with(
            "bad.yaml:8:20: access_log.fields[1]: unknown access-log field `referrer`, expected \
             one of client, method, host, path, query, protocol, status,"
        ),
        "{found:#?}"
    );
    assert!(found[1].contains("did you mean `referer`?"), "{found:#?}");
    assert!(
        found[2].starts_with("bad.yaml:8:30: access_log.fields[2]: `status` is listed twice"),
        "{found:#?}"
    );
    assert!(
        found[3]
            .starts_with("bad.yaml:9:19: access_log.sample_success: `150%` is not a percentage"),
        "{found:#?}"
    );
    assert!(
        found[4].starts_with(
            "bad.yaml:10:3: unknown field `colour`, expected one of format, fields, sample_success"
        ),
        "{found:#?}"
    );
    let empty = errors(&format!("{BASE}access_log: {{ fields: [] }}\n"));
    assert!(
        empty[0].starts_with("bad.yaml:6:23: access_log.fields: no fields"),
        "{empty:#?}"
    );
}

#[test]
fn combined_is_a_format_whose_fields_cannot_be_chosen() {
    let yaml = format!("{BASE}access_log: {{ format: combined, sample_success: 50% }}\n");
    let config = parse(&yaml, "ok.yaml").expect("valid");
    assert_eq!(config.access_log.format, Some(LogFormat::Combined));
    assert_eq!(config.access_log.sample_success, 0.5);
    let found = errors(&format!(
        "{BASE}access_log: {{ format: combined, fields: [status] }}\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "bad.yaml:6:41: access_log.fields: `fields` does not apply to `format: combined`"
        ),
        "{found:#?}"
    );
}

#[test]
fn a_forward_auth_user_header_must_be_one_of_its_response_headers() {
    let base = with_routes(
        "routes: [ { cluster: web, auth: { forward: { cluster: web, response_headers: [x-user], \
         user_header: USER } } } ]",
    );
    let config = parse(&base.replace("USER", "X-User"), "ok.yaml").expect("valid");
    let Some(duet_config::filter::auth::Auth::Forward(forward)) = &config.routes[0].filters.auth
    else {
        panic!("forward auth");
    };
    assert_eq!(forward.user_header.as_deref(), Some("x-user"));
    let found = errors(&base.replace("USER", "x-groups"));
    assert!(
        found[0].contains("routes[0].auth.forward.user_header: `x-groups` is not one of `response_headers` (x-user)"),
        "{found:#?}"
    );
}
