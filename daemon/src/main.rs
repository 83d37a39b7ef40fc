//! ttraced, the trace collector (issue 4).
fn main() {
    eprintln!("ttraced: the capture path is not built yet (issue 4)");
    std::process::exit(2);
}
