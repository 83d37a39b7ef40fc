//! Byte counts on the command line (`256M`) and in summaries (`1.2 GiB`).

/// Parses `4096`, `64K`, `256M`, `1G` (powers of 1024; `KiB`/`MiB`/`GiB` and `B` accepted).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 4096, 64K, 256M, 1G)"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (K, M, G, T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// `1.23 GiB`, `512 B`.
pub fn human(bytes: u64) -> String {
    ttrace_format::units::human_bytes(bytes, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("M").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn sizes_print_readably() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(3 << 30), "3.00 GiB");
    }
}
