//! libttrace.so's hooks have NVIDIA's exact C signatures: every export in
//! `intercept/src/hooks` (those written out and those the hook macros make: NCCL's
//! `coll_hook!`, `comm_hook!` and `put_signal_hook!`, cuBLAS's `gemm_hook!`, `blas_gap!`, `blas_copy_hook!`, cuBLAS-XT's `xt_gap!` and the legacy API's `legacy_gap!`, the driver's `cu_copy_hook!`, `cu_memset_hook!` and `cu_gap!`, cuBLASLt's
//! `lt_hook!`, cudart's `copy_hook!`, `copy_3d_hook!`, `batch_copy_hook!`, `batch_3d_hook!`,
//! `one_3d_hook!`, `array_copy_hook!`, `memset_hook!`, `launch_hook!`, `graph_hook!` (and the driver's `cu_graph_hook!`) and `entry_point_hook!`, NVTX's `nvtx_hook!`, and each entry of a signature list such as `cublas_sigs!`, expanded through
//! its family's macro as rustc does) is compiled against NVIDIA's headers by the ABI checker
//! of the simulated libraries (`integration_tests::abi_check`), and the built library exports
//! nothing else.
//!
//! Not compiled: the `ttrace_*` C API of include/ttrace.h (not NVIDIA's).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use integration_tests::abi_check::{self, check, dynamic_symbols, AbiTypes, Export};
use integration_tests::profile_dir;
use syn::parse::{Parse, ParseStream};
use syn::visit::Visit;

/// One hook macro invocation: `#[doc] name(args) => ...`, or `#[doc] name(args) -> type, ...
/// => ...` for a macro whose hooks' return types differ (what follows says how the call is
/// captured, not its signature). `name / other(args) => ...` makes a hook of each name with
/// that signature (the driver's per-thread default stream spellings).
struct MacroHook {
    names: Vec<syn::Ident>,
    args: syn::punctuated::Punctuated<syn::FnArg, syn::Token![,]>,
    ret: Option<syn::Type>,
}

impl Parse for MacroHook {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let _ = input.call(syn::Attribute::parse_outer)?;
        let mut names: Vec<syn::Ident> = vec![input.parse()?];
        while input.peek(syn::Token![/]) {
            let _: syn::Token![/] = input.parse()?;
            names.push(input.parse()?);
        }
        let content;
        syn::parenthesized!(content in input);
        let args = content.parse_terminated(syn::FnArg::parse, syn::Token![,])?;
        let ret = if input.peek(syn::Token![->]) {
            let _: syn::Token![->] = input.parse()?;
            Some(input.parse()?)
        } else {
            let _: syn::Token![=>] = input.parse()?;
            None
        };
        let _: proc_macro2::TokenStream = input.parse()?;
        Ok(MacroHook { names, args, ret })
    }
}

/// The signature lists: `list! { family { (entry) ... } ... }`, each entry expanded through
/// the file's `macro_rules! family` (one rule) to a hook macro invocation above.
const SIGNATURE_LISTS: [&str; 1] = ["cublas_sigs"];

/// The hook macros and the C return type of the functions they make (`nvtx_hook!`'s: the
/// `-> type` of an invocation, else void).
const HOOK_MACROS: [(&str, &str); 24] = [
    ("entry_point_hook", "cudaError_t"),
    ("coll_hook", "ncclResult_t"),
    ("comm_hook", "ncclResult_t"),
    ("put_signal_hook", "ncclResult_t"),
    ("copy_hook", "cudaError_t"),
    ("copy_3d_hook", "cudaError_t"),
    ("batch_copy_hook", "cudaError_t"),
    ("batch_3d_hook", "cudaError_t"),
    ("array_copy_hook", "cudaError_t"),
    ("one_3d_hook", "cudaError_t"),
    ("memset_hook", "cudaError_t"),
    ("launch_hook", "cudaError_t"),
    ("graph_hook", "cudaError_t"),
    ("cu_graph_hook", "CUresult"),
    ("gemm_hook", "cublasStatus_t"),
    ("blas_gap", "cublasStatus_t"),
    ("xt_gap", "cublasStatus_t"),
    ("legacy_gap", "()"),
    ("blas_copy_hook", "cublasStatus_t"),
    ("cu_copy_hook", "CUresult"),
    ("cu_memset_hook", "CUresult"),
    ("cu_gap", "CUresult"),
    ("lt_hook", "cublasStatus_t"),
    ("nvtx_hook", "()"),
];

/// A family macro of a signature list: `macro_rules! family { (matcher) => { hook! { ... } }; }`
/// with one rule whose matcher is `$name:frag, ...` (no repetition but an optional trailing
/// comma).
struct Family {
    /// The metavariables of the matcher, in order.
    vars: Vec<String>,
    /// The transcriber: what one entry expands to.
    body: proc_macro2::TokenStream,
}

impl Family {
    /// The family macro `m` defines, if it is one (a single rule without repetitions).
    fn parse(m: &syn::ItemMacro) -> Option<(String, Family)> {
        use proc_macro2::TokenTree as T;
        if !m.mac.path.is_ident("macro_rules") {
            return None;
        }
        let name = m.ident.as_ref()?.to_string();
        let toks: Vec<T> = m.mac.tokens.clone().into_iter().collect();
        let (T::Group(matcher), T::Group(body)) = (toks.first()?, toks.get(3)?) else {
            return None;
        };
        if toks.len() > 5 {
            return None; // more than one rule: not a family
        }
        let mt: Vec<T> = matcher.stream().into_iter().collect();
        let mut vars = Vec::new();
        for w in mt.windows(2) {
            if let (T::Punct(p), T::Ident(i)) = (&w[0], &w[1]) {
                if p.as_char() == '$' {
                    vars.push(i.to_string());
                }
            }
        }
        Some((
            name,
            Family {
                vars,
                body: body.stream(),
            },
        ))
    }

    /// The transcriber with each `$var` replaced by the entry's tokens.
    fn expand(&self, entry: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
        use proc_macro2::TokenTree as T;
        let mut args: Vec<Vec<T>> = vec![Vec::new()];
        for t in entry {
            match &t {
                T::Punct(p) if p.as_char() == ',' => args.push(Vec::new()),
                _ => args.last_mut().expect("one").push(t),
            }
        }
        args.retain(|a| !a.is_empty());
        assert_eq!(
            args.len(),
            self.vars.len(),
            "an entry has one value per metavariable"
        );
        let bound: std::collections::HashMap<&str, &Vec<T>> =
            self.vars.iter().map(String::as_str).zip(&args).collect();
        substitute(self.body.clone(), &bound)
    }
}

/// `stream` with each `$var` of `bound` replaced by its tokens (groups recursed into).
fn substitute(
    stream: proc_macro2::TokenStream,
    bound: &std::collections::HashMap<&str, &Vec<proc_macro2::TokenTree>>,
) -> proc_macro2::TokenStream {
    use proc_macro2::TokenTree as T;
    let toks: Vec<T> = stream.into_iter().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (T::Punct(p), Some(T::Ident(v))) if p.as_char() == '$' => {
                if let Some(b) = bound.get(v.to_string().as_str()) {
                    out.extend(b.iter().cloned());
                    i += 2;
                    continue;
                }
                out.push(toks[i].clone());
            }
            (T::Group(g), _) => {
                let mut ng = proc_macro2::Group::new(g.delimiter(), substitute(g.stream(), bound));
                ng.set_span(g.span());
                out.push(T::Group(ng));
            }
            (t, _) => out.push(t.clone()),
        }
        i += 1;
    }
    out.into_iter().collect()
}

/// The entries of a signature list: `list! { family { (entry) (entry) ... } ... }`, as
/// `(family, entry tokens)`.
fn list_entries(m: &syn::ItemMacro) -> Vec<(String, proc_macro2::TokenStream)> {
    use proc_macro2::TokenTree as T;
    let toks: Vec<T> = m.mac.tokens.clone().into_iter().collect();
    let mut out = Vec::new();
    for w in toks.windows(2) {
        if let (T::Ident(family), T::Group(g)) = (&w[0], &w[1]) {
            for e in g.stream() {
                if let T::Group(entry) = e {
                    out.push((family.to_string(), entry.stream()));
                }
            }
        }
    }
    out
}

struct Hooks<'a> {
    file: &'a Path,
    library: String,
    /// The family macros of the file (by name).
    families: std::collections::HashMap<String, Family>,
    out: Vec<Export>,
}

impl Hooks<'_> {
    fn hook(&mut self, mac: &str, ret: &str, tokens: proc_macro2::TokenStream) {
        let h: MacroHook =
            syn::parse2(tokens).unwrap_or_else(|e| panic!("{mac}! body parses: {e}"));
        let args = &h.args;
        let ret: syn::Type = match h.ret {
            Some(t) => t,
            None => syn::parse_str(ret).unwrap_or_else(|e| panic!("{mac}!: {ret}: {e}")),
        };
        for name in &h.names {
            self.out.push(Export {
                name: name.to_string(),
                library: self.library.clone(),
                file: self.file.to_path_buf(),
                sig: syn::parse_quote!(unsafe extern "C" fn #name(#args) -> #ret),
            });
        }
    }

    /// An entry of a signature list: its family's expansion, visited as the file's items are.
    fn entry(&mut self, family: &str, entry: proc_macro2::TokenStream) {
        let f = self
            .families
            .get(family)
            .unwrap_or_else(|| panic!("{}: no family macro `{family}`", self.file.display()));
        let expanded = f.expand(entry);
        let file: syn::File =
            syn::parse2(expanded).unwrap_or_else(|e| panic!("{family}! expands to items: {e}"));
        self.visit_file(&file);
    }
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
        if let Some((mac, ret)) = HOOK_MACROS.iter().find(|(mac, _)| m.mac.path.is_ident(mac)) {
            self.hook(mac, ret, m.mac.tokens.clone());
        } else if SIGNATURE_LISTS.iter().any(|l| m.mac.path.is_ident(l)) {
            for (family, entry) in list_entries(m) {
                self.entry(&family, entry);
            }
        }
    }
}

/// The family macros defined in `file`.
fn families(file: &syn::File) -> std::collections::HashMap<String, Family> {
    file.items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Macro(m) => Family::parse(m),
            _ => None,
        })
        .collect()
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
        out.extend(exports_of(&f, &text));
    }
    out
}

/// The hook exports of one file of `intercept/src/hooks` whose text is `text`.
fn exports_of(f: &Path, text: &str) -> Vec<Export> {
    let ast = syn::parse_file(text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    let stem = f.file_stem().expect("stem").to_string_lossy().into_owned();
    let mut v = Hooks {
        file: f,
        library: format!("libttrace/{stem}"),
        families: families(&ast),
        out: Vec::new(),
    };
    v.visit_file(&ast);
    v.out
}

/// Hooks of entry points the CUDA 12 header set lacks: NCCL 2.28's (it has NCCL 2.27) and
/// CUDA 13's, checked against the CUDA 13 header set (NCCL 2.30).
const NEWER: [&str; 20] = [
    "ncclAlltoAll",
    "ncclPutSignal",
    "ncclGather",
    "ncclScatter",
    "pncclAlltoAll",
    "pncclPutSignal",
    "pncclGather",
    "pncclScatter",
    "cudaMemcpyWithAttributesAsync",
    "cudaMemcpyWithAttributesAsync_ptsz",
    "cudaMemcpy3DWithAttributesAsync",
    "cudaMemcpy3DWithAttributesAsync_ptsz",
    "cuMemcpyBatchAsync_v2",
    "cuMemcpy3DBatchAsync_v2",
    "cuMemcpyWithAttributesAsync",
    "cuMemcpy3DWithAttributesAsync",
    "cuMemcpyBatchAsync_v2_ptsz",
    "cuMemcpy3DBatchAsync_v2_ptsz",
    "cuMemcpyWithAttributesAsync_ptsz",
    "cuMemcpy3DWithAttributesAsync_ptsz",
];

#[test]
fn every_hook_matches_nvidias_headers() {
    let include = abi_check::fetch_headers().unwrap_or_else(|e| panic!("headers: {e}"));
    let abi = AbiTypes::parse(&abi_check::repo_root().join("abi/src")).expect("cuda-abi parses");
    let all = hook_exports();
    // NCCL 2.28+ and CUDA 13 entry points are declared by the CUDA 13 header set only.
    let newer = |e: &Export| NEWER.contains(&e.name.as_str());
    let exports: Vec<Export> = all
        .iter()
        .filter(|e| !e.library.ends_with("/api") && !newer(e))
        .cloned()
        .collect();
    assert!(exports.len() >= 45, "only {} hooks found", exports.len());
    let exports13: Vec<Export> = all.iter().filter(|e| newer(e)).cloned().collect();
    assert_eq!(
        exports13.len(),
        NEWER.len(),
        "the NCCL 2.28 and CUDA 13 hooks"
    );
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
        "NCCL 2.28+ and CUDA 13 hooks that differ from NVIDIA's CUDA 13 headers:\n{}",
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
    let mut found: BTreeSet<String> = all.iter().map(|e| e.name.clone()).collect();
    // The interposed dlsym (intercept/src/dlsym.rs; the C library's signature, not NVIDIA's).
    if cfg!(target_arch = "x86_64") {
        found.insert("dlsym".into());
    }
    // NVTX's tool entry point (intercept/src/nvtx_tool.rs): called by NVTX's loader, not a hook
    // (intercept_nvtx runs it under NVIDIA's own loader code).
    found.insert("InitializeInjectionNvtx2".into());
    assert_eq!(symbols, found, "exports of {}", lib.display());
}

#[test]
fn every_hook_is_a_simulated_export_of_the_same_c_type() {
    // The hooks' signature lists and the simulated libraries agree: each hooked symbol can be
    // exercised on the simulated stack, with the C type the headers give it (abi.rs checks
    // the simulator against the headers; this checks the two lists against each other).
    let repo = abi_check::repo_root();
    let abi = AbiTypes::parse(&repo.join("abi/src")).expect("cuda-abi parses");
    let sim = abi_check::parse_exports(&repo.join("tests/sim")).expect("the simulator parses");
    let mut missing = Vec::new();
    let mut differ = Vec::new();
    // NCCL 2.28 and CUDA 13 entry points are in the CUDA 13 build of the simulator only.
    let hooks: Vec<Export> = hook_exports()
        .into_iter()
        .filter(|e| !e.library.ends_with("/api") && !NEWER.contains(&e.name.as_str()))
        .collect();
    for h in &hooks {
        let want = abi
            .fn_type(&h.sig)
            .unwrap_or_else(|e| panic!("{}: {e}", h.name));
        let same = sim.iter().filter(|s| s.name == h.name);
        let types: Vec<_> = same.map(|s| abi.fn_type(&s.sig)).collect();
        if types.is_empty() {
            missing.push(h.name.clone());
        } else if !types.iter().any(|t| t.as_ref() == Ok(&want)) {
            differ.push(format!("{}: hook {want:?}, simulator {types:?}", h.name));
        }
    }
    assert!(hooks.len() >= 140, "only {} hooks found", hooks.len());
    assert!(
        missing.is_empty(),
        "hooks the simulator does not export: {missing:?}"
    );
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

#[test]
fn a_wrong_type_in_a_signature_list_line_or_family_fails_the_check() {
    // Negative controls: the check sees what a list line and its family's macro make. The
    // element type of one line (f32 -> f64), and the size type of one family's `ldc` (`$int`
    // -> `c_int`, wrong for the `_64` lines only), each fail exactly the hooks they change.
    let include = abi_check::fetch_headers().unwrap_or_else(|e| panic!("headers: {e}"));
    let repo = abi_check::repo_root();
    let abi = AbiTypes::parse(&repo.join("abi/src")).expect("cuda-abi parses");
    let file = repo.join("intercept/src/hooks/cublas.rs");
    let text = std::fs::read_to_string(&file).expect("read");
    let line = "(cublasSgemm_v2, c_int, f32, CUDA_R_32F,";
    assert!(text.contains(line), "the list has the line {line}");
    let mutated = text.replacen(line, "(cublasSgemm_v2, c_int, f64, CUDA_R_32F,", 1);
    let strided = "macro_rules! typed_strided";
    let at = mutated.find(strided).expect("the typed_strided family");
    let ldc = at + mutated[at..].find("ldc: $int").expect("ldc in the family");
    let mutated = format!(
        "{}ldc: c_int{}",
        &mutated[..ldc],
        &mutated[ldc + "ldc: $int".len()..]
    );
    let exports = exports_of(&file, &mutated);
    let report = check(
        &exports,
        &abi,
        &include,
        &profile_dir().join("abi-check-neg-list"),
        "neg_list",
    );
    let failed: BTreeSet<String> = exports
        .iter()
        .filter(|e| report.fails_export(&e.name))
        .map(|e| e.name.clone())
        .collect();
    let want: BTreeSet<String> = [
        "cublasSgemm_v2",
        "cublasSgemmStridedBatched_64",
        "cublasDgemmStridedBatched_64",
        "cublasHgemmStridedBatched_64",
    ]
    .map(String::from)
    .into();
    assert_eq!(failed, want, "{}", report.describe_failures());
}

#[test]
fn a_wrong_type_in_any_hook_macro_line_fails_the_check() {
    // Negative controls for the hook macros other than cuBLAS's list: one type changed in one
    // line of each (a return type of `nvtx_hook!`, a void NVTX mark made `int`, a parameter
    // of `comm_hook!`, `graph_hook!`, `lt_hook!`, `xt_gap!` and `launch_hook!`) fails exactly
    // that hook.
    let include = abi_check::fetch_headers().unwrap_or_else(|e| panic!("headers: {e}"));
    let repo = abi_check::repo_root();
    let abi = AbiTypes::parse(&repo.join("abi/src")).expect("cuda-abi parses");
    let mutations: [(&str, &str, &str, &str); 7] = [
        (
            "nvtx.rs",
            "nvtxRangePushA(message: *const c_char) -> c_int,",
            "nvtxRangePushA(message: *const c_char) -> c_uint,",
            "nvtxRangePushA",
        ),
        (
            "nvtx.rs",
            "nvtxMarkA(message: *const c_char)\n",
            "nvtxMarkA(message: *const c_char) -> c_int, else 0\n",
            "nvtxMarkA",
        ),
        (
            "nccl.rs",
            "ncclCommDestroy(comm: ncclComm_t)",
            "ncclCommDestroy(comm: *mut ncclComm_t)",
            "ncclCommDestroy",
        ),
        (
            "graph.rs",
            "cudaGraphDestroy(graph: cudaGraph_t)",
            "cudaGraphDestroy(graph: *mut cudaGraph_t)",
            "cudaGraphDestroy",
        ),
        (
            "cublaslt.rs",
            "workspaceSizeInBytes: usize,",
            "workspaceSizeInBytes: u32,",
            "cublasLtMatmul",
        ),
        (
            "cublasxt_routines.rs",
            "cublasXtSgemm(\n        handle: cublasXtHandle_t,\n        transa: cublasOperation_t,\n        transb: cublasOperation_t,\n        m: usize,",
            "cublasXtSgemm(\n        handle: cublasXtHandle_t,\n        transa: cublasOperation_t,\n        transb: cublasOperation_t,\n        m: u32,",
            "cublasXtSgemm",
        ),
        (
            "cudart.rs",
            "cudaLaunchHostFunc(stream: cudaStream_t, fn_: cudaHostFn_t, userData: *mut c_void)",
            "cudaLaunchHostFunc(stream: cudaStream_t, fn_: cudaHostFn_t, userData: *mut c_int)",
            "cudaLaunchHostFunc",
        ),
    ];
    let mut texts = std::collections::BTreeMap::new();
    for (file, from, to, _) in mutations {
        let path = repo.join("intercept/src/hooks").join(file);
        let text = texts
            .entry(path.clone())
            .or_insert_with(|| std::fs::read_to_string(&path).expect("read"));
        assert_eq!(
            text.matches(from).count(),
            1,
            "{file} has the line {from:?} once"
        );
        *text = text.replacen(from, to, 1);
    }
    let exports: Vec<Export> = texts
        .iter()
        .flat_map(|(path, text)| exports_of(path, text))
        .filter(|e| !NEWER.contains(&e.name.as_str()))
        .collect();
    let report = check(
        &exports,
        &abi,
        &include,
        &profile_dir().join("abi-check-neg-macros"),
        "neg_macros",
    );
    let failed: BTreeSet<String> = exports
        .iter()
        .filter(|e| report.fails_export(&e.name))
        .map(|e| e.name.clone())
        .collect();
    let mut want: BTreeSet<String> = mutations.iter().map(|m| m.3.to_string()).collect();
    // `ncclCommDestroy / pncclCommDestroy(...)`: one line makes both names' hooks.
    want.insert("pncclCommDestroy".into());
    assert_eq!(failed, want, "{}", report.describe_failures());
}
