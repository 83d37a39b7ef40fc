//! Keeping credentials out of a store's manifest.
//!
//! The manifest records the traced command's environment (to reproduce a run), and stores are
//! copied, attached to bug reports and shared. A variable whose *name* looks like it holds a
//! credential has its value replaced by [`REDACTED`]; so does the password of a URL
//! (`scheme://user:password@host`) in any value. Names the user vouches for
//! (`ttrace run --env-allow NAME`) are kept verbatim.

use std::collections::BTreeMap;

/// What a redacted value reads as in the manifest.
pub const REDACTED: &str = "<redacted>";

/// Name fragments (matched case-insensitively, anywhere in the name) of credentials.
const DENY_FRAGMENTS: &[&str] = &[
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "PRIVATE",
    "API_KEY",
    "APIKEY",
    "ACCESS_KEY",
    "COOKIE",
    "SIGNATURE",
];

/// Whether a variable name looks like it holds a credential.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    DENY_FRAGMENTS.iter().any(|f| n.contains(f))
        || n.ends_with("_KEY")
        || n == "KEY"
        || n.ends_with("_PW")
        || n.ends_with("_PASS")
}

/// `value` with the password of every `scheme://user:password@host` replaced; `None` when
/// there is none.
fn redact_url_passwords(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    let mut changed = false;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon + 1]);
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
                changed = true;
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// Redacts `env` in place (see the module documentation); `allow` lists names kept verbatim.
/// Returns the names redacted.
pub fn redact_env(env: &mut BTreeMap<String, String>, allow: &[String]) -> Vec<String> {
    let mut redacted = Vec::new();
    for (k, v) in env.iter_mut() {
        if allow.iter().any(|a| a == k) {
            continue;
        }
        if is_secret_name(k) {
            *v = REDACTED.to_string();
            redacted.push(k.clone());
        } else if let Some(r) = redact_url_passwords(v) {
            *v = r;
            redacted.push(k.clone());
        }
    }
    redacted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_and_the_rest_kept() {
        let mut env: BTreeMap<String, String> = [
            ("AWS_SECRET_ACCESS_KEY", "abc"),
            ("AWS_ACCESS_KEY_ID", "AKIA"),
            ("HF_TOKEN", "hf_x"),
            ("WANDB_API_KEY", "k"),
            ("GITHUB_TOKEN", "t"),
            ("DB_URL", "postgres://me:hunter2@db:5432/x"),
            ("PATH", "/usr/bin"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("KEYBOARD", "us"),
            ("HTTP_PROXY", "http://proxy:3128"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let red = redact_env(&mut env, &["GITHUB_TOKEN".to_string()]);
        assert_eq!(env["AWS_SECRET_ACCESS_KEY"], REDACTED);
        assert_eq!(env["AWS_ACCESS_KEY_ID"], REDACTED);
        assert_eq!(env["HF_TOKEN"], REDACTED);
        assert_eq!(env["WANDB_API_KEY"], REDACTED);
        assert_eq!(env["GITHUB_TOKEN"], "t", "allowed by name");
        assert_eq!(env["DB_URL"], "postgres://me:<redacted>@db:5432/x");
        assert_eq!(env["PATH"], "/usr/bin");
        assert_eq!(env["MASTER_ADDR"], "10.0.0.1");
        assert_eq!(env["KEYBOARD"], "us");
        assert_eq!(env["HTTP_PROXY"], "http://proxy:3128");
        assert_eq!(red.len(), 5);
    }
}
