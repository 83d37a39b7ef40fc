//! Sizes as people read them, for every command's output (`ttrace ls`, `stats`, `compare`'s
//! report).

/// `bytes` in the largest binary unit that keeps the value at 1 or more, with `decimals`
/// digits after the point: `512 B`, `1.50 KiB`, `3.0 GiB` (whole bytes have none).
pub fn human_bytes(bytes: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.decimals$} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_the_largest_unit_that_keeps_them_at_one_or_more() {
        assert_eq!(human_bytes(512, 2), "512 B");
        assert_eq!(human_bytes(1536, 2), "1.50 KiB");
        assert_eq!(human_bytes(1536, 1), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30, 1), "3.0 GiB");
        assert_eq!(human_bytes(5 << 40, 0), "5 TiB");
        assert_eq!(human_bytes(u64::MAX, 2), "16777216.00 TiB");
    }
}
