//! libttrace.so's hooks have NVIDIA's exact C signatures: every export in
//! `intercept/src/hooks` (those written out and those the hook macros make: NCCL's
//! `coll_hook!`, cuBLAS's `gemm_hook!` and `blas_gap!`, cudart's `memset_hook!`) is
//! compiled against NVIDIA's headers by the ABI checker of the simulated libraries
//! (`integration_tests::abi_check`), and the built library exports nothing else.
//!
//! Not compiled: the `ttrace_*` C API of include/ttrace.h (not NVIDIA's).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use integration_tests::abi_check::{self, check, dynamic_symbols, AbiTypes, Export};
use integration_tests::profile_dir;
use syn::parse::{Parse, ParseStream};
use syn::visit::Visit;

/// One hook macro invocation: `#[doc] name(args) => ...` (what follows `=>` says how the call
/// is captured, not its signature).
struct MacroHook {
    name: syn::Ident,
    args: syn::punctuated::Punctuated<syn::FnArg, syn::Token![,]>,
}

impl Parse for MacroHook {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let _ = input.call(syn::Attribute::parse_outer)?;
        let name: syn::Ident = input.parse()?;
        let content;
        syn::parenthesized!(content in input);
        let args = content.parse_terminated(syn::FnArg::parse, syn::Token![,])?;
        let _: syn::Token![=>] = input.parse()?;
        let _: proc_macro2::TokenStream = input.parse()?;
        Ok(MacroHook { name, args })
    }
}

/// The hook macros and the C return type of the functions they make.
const HOOK_MACROS: [(&str, &str); 4] = [
    ("coll_hook", "ncclResult_t"),
    ("memset_hook", "cudaError_t"),
    ("gemm_hook", "cublasStatus_t"),
    ("blas_gap", "cublasStatus_t"),
];

struct Hooks<'a> {
    file: &'a Path,
    library: String,
    out: Vec<Export>,
}

impl<'ast> Visit<'ast> for Hooks<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if f.attrs.iter().any(|a| a.path().is_ident("no_mangle")) {
            self.out.push(Export {
                name: f.sig.ident.to_string(),
                library: self.library.clone(),
                file: self.file.to_path_buf(),
                sig: f.sig.clone(),
            });
        }
    }

    fn visit_item_macro(&mut self, m: &'ast syn::ItemMacro) {
        let Some((mac, ret)) = HOOK_MACROS.iter().find(|(mac, _)| m.mac.path.is_ident(mac)) else {
            return;
        };
        let h: MacroHook = m
            .mac
            .parse_body()
            .unwrap_or_else(|e| panic!("{mac}! body parses: {e}"));
        let (name, args) = (&h.name, &h.args);
        let ret = syn::Ident::new(ret, proc_macro2::Span::call_site());
        self.out.push(Export {
            name: name.to_string(),
            library: self.library.clone(),
            file: self.file.to_path_buf(),
            sig: syn::parse_quote!(unsafe extern "C" fn #name(#args) -> #ret),
        });
    }
}

/// Every hook export in `intercept/src/hooks`.
fn hook_exports() -> Vec<Export> {
    let dir = abi_check::repo_root().join("intercept/src/hooks");
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("hooks dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let stem = f.file_stem().expect("stem").to_string_lossy().into_owned();
        let mut v = Hooks {
            file: &f,
            library: format!("libttrace/{stem}"),
            out: Vec::new(),
        };
        v.visit_file(&ast);
        out.extend(v.out);
    }
    out
}

/// Hooks of entry points NCCL added in 2.28 (absent from the CUDA 12 header set's NCCL 2.27).
const NCCL_2_28: [&str; 3] = ["ncclAlltoAll", "ncclGather", "ncclScatter"];

#[test]
fn every_hook_matches_nvidias_headers() {
    let include = abi_check::fetch_headers().unwrap_or_else(|e| panic!("headers: {e}"));
    let abi = AbiTypes::parse(&abi_check::repo_root().join("abi/src")).expect("cuda-abi parses");
    let all = hook_exports();
    // NCCL 2.28+ entry points are declared by the CUDA 13 header set only (NCCL 2.30).
    let newer = |e: &Export| NCCL_2_28.contains(&e.name.as_str());
    let exports: Vec<Export> = all
        .iter()
        .filter(|e| !e.library.ends_with("/api") && !newer(e))
        .cloned()
        .collect();
    assert!(exports.len() >= 45, "only {} hooks found", exports.len());
    let exports13: Vec<Export> = all.iter().filter(|e| newer(e)).cloned().collect();
    assert_eq!(exports13.len(), NCCL_2_28.len(), "the NCCL 2.28 hooks");
    let include13 = abi_check::fetch_headers_for(13).unwrap_or_else(|e| panic!("headers: {e}"));
    let report13 = check(
        &exports13,
        &abi,
        &include13,
        &profile_dir().join("abi-check-hooks13"),
        "libttrace13",
    );
    // Only the functions: cuda-abi's structs are CUDA 12's (abi_cuda13 checks CUDA 13's).
    let hook_failures: Vec<String> = report13
        .failures
        .iter()
        .filter(|f| !matches!(f.subject, abi_check::Subject::Record(_)))
        .map(|f| format!("* {}:\n    {}", f.subject, f.message))
        .collect();
    assert!(
        hook_failures.is_empty(),
        "NCCL 2.28+ hooks that differ from NVIDIA's NCCL 2.30 headers:\n{}",
        hook_failures.join("\n")
    );
    assert_eq!(report13.exports_checked.len(), exports13.len());
    let report = check(
        &exports,
        &abi,
        &include,
        &profile_dir().join("abi-check"),
        "libttrace",
    );
    assert!(
        report.failures.is_empty(),
        "hooks that differ from NVIDIA's headers:\n{}",
        report.describe_failures()
    );
    assert!(report.exports_checked.len() >= exports.len());

    // The built library exports exactly the hooks found here (and the C API).
    let lib = profile_dir().join("libttrace.so");
    let symbols: BTreeSet<String> = dynamic_symbols(&lib)
        .expect("nm")
        .into_iter()
        .filter(|s| !s.starts_with('_'))
        .collect();
    let found: BTreeSet<String> = all.iter().map(|e| e.name.clone()).collect();
    assert_eq!(symbols, found, "exports of {}", lib.display());
}
