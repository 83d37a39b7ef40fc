//! The ABI fidelity check: every C entry point the simulated libraries export, and every C
//! struct `cuda-abi` mirrors, compiled by gcc against NVIDIA's own headers.
//!
//! How it works, mechanically:
//! 1. [`parse_exports`] reads the Rust sources of the simulated libraries
//!    (`tests/sim/{cudart,cublas,cublaslt,nccl,nvtx}/src/**/*.rs`) with `syn` and collects every
//!    `#[no_mangle]` (or `#[export_name]`) `extern "C" fn`, except the private `__sim*` ones.
//! 2. [`AbiTypes::parse`] reads `abi/src/*.rs`: type aliases, `#[repr(C)]` structs and unions,
//!    opaque structs (`opaque_struct!`) and integer constants (array lengths).
//! 3. [`AbiTypes::c_type`] translates a Rust type to its C type by ABI: aliases are resolved to
//!    their definitions (`cudaError_t = c_uint` becomes `unsigned int`), primitives map exactly
//!    (`c_longlong` -> `long long`, `i64` -> `int64_t`, `usize` -> `size_t`), `*mut T` -> `T *`,
//!    `*const T` -> `T const *`, `Option<extern "C" fn>` -> a function pointer, structs to their
//!    C spelling ([`c_spelling`]).
//! 4. [`check`] writes C files that include the NVIDIA headers and, per export `X`, declare
//!    `extern R sim_X(P...);` from the Rust signature and assign it to a pointer of the header's
//!    type, `static __typeof__(&X) const chk_X = &sim_X;`, so that any difference in a parameter
//!    or return type (`void *` vs `const void *`, `int` vs `unsigned int`, a missing parameter)
//!    or a name no header declares fails the compilation. For each struct, a C mirror is built
//!    from the Rust fields and `_Static_assert`s compare size, alignment, and each field's offset
//!    and type with the header's struct. gcc's errors are mapped back to the export or struct by
//!    line number.
//! 5. The headers hide some exported symbols behind renaming macros (`cudaMemcpy` becomes
//!    `cudaMemcpy_ptds` with `-DCUDA_API_PER_THREAD_DEFAULT_STREAM`; `cudaStreamGetCaptureInfo`
//!    becomes `cudaStreamGetCaptureInfo_v2` for applications while the library still exports
//!    the legacy 3-parameter `cudaStreamGetCaptureInfo`). So each export is checked in several
//!    [`View`]s of the headers, after `#undef`ing its name so that the comparison is with the
//!    declaration of that very symbol: it must be declared in at least one view and agree with
//!    every view that declares it.
//!
//! Limits: a header field the Rust struct omits goes unnoticed when it sits in what is padding
//! on the Rust side and the size still matches (C cannot list a struct's fields), and a Rust
//! field named `_...` (standing for an anonymous union the mirror cannot name) is checked only
//! through its struct's size and alignment; a function
//! the headers declare only for C++ (`#if defined(__cplusplus)`, e.g. cuBLAS's `__half` API) is
//! checked in a C++ file instead, where an enum matches its underlying type.
//!
//! gcc treats an enum whose values are all non-negative as compatible with `unsigned int` and
//! one with a negative value as `int`: the `cuda-abi` convention (`c_uint`/`c_int` aliases)
//! follows that rule, and this check enforces it. Behind a pointer (an array of
//! `cublasOperation_t`) C does not apply that rule: a function that differs from its C
//! declaration only by incompatible pointer types is checked again in C++, where an enum
//! matches its underlying type member-wise; it passes only if C++ agrees.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use syn::ext::IdentExt;
use syn::visit::Visit;

/// The simulated libraries: directories under `tests/sim`.
pub const SIM_LIBRARIES: [&str; 6] = ["cudart", "cublas", "cublaslt", "nccl", "nvtx", "driver"];

/// Headers every generated C file includes, in order.
pub const HEADERS: [&str; 9] = [
    "cuda.h",
    "cuda_runtime_api.h",
    "cuda_profiler_api.h",
    "cublas_v2.h",
    "cublasXt.h",
    "cublasLt.h",
    "nccl.h",
    "nvToolsExt.h",
    "nvToolsExtCudaRt.h",
];

/// Structs and unions whose C name is a `typedef` of an anonymous struct, or a typedef that
/// does not end in `_t`; everything else is spelled `struct X` / `union X`, except names ending
/// in `_t`, which are typedef names unless listed in [`C_TAGS`].
pub const C_TYPEDEF_NAMES: [&str; 1] = ["ncclUniqueId"];

/// Struct or union tags ending in `_t` (declared inside another struct, without a typedef).
pub const C_TAGS: [&str; 2] = ["payload_t", "identifier_t"];

/// C type names the Rust side spells as aliases of a primitive but the check keeps as they are
/// (their definition is target-dependent; the header uses the name).
pub const C_BUILTIN_TYPEDEFS: [&str; 1] = ["wchar_t"];

/// The repository root.
pub fn repo_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize().unwrap_or(dir)
}

/// Runs `scripts/fetch-nvidia-headers.py` (idempotent: quick when the headers are cached) and
/// returns the include directories, in `-I` order. `$TTRACE_NVIDIA_HEADERS` overrides the cache
/// directory.
pub fn fetch_headers() -> Result<Vec<PathBuf>, String> {
    fetch_headers_for(12)
}

/// [`fetch_headers`] for CUDA major 12 or 13 (`--cuda 13`: CUDA 13.2, cuBLAS 13.4, NCCL 2.30;
/// `$TTRACE_NVIDIA_HEADERS/cuda13` when that variable is set).
pub fn fetch_headers_for(major: u32) -> Result<Vec<PathBuf>, String> {
    let repo = repo_root();
    let script = repo.join("scripts/fetch-nvidia-headers.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg("--cuda").arg(major.to_string());
    if let Some(dest) = std::env::var_os("TTRACE_NVIDIA_HEADERS") {
        let dest = PathBuf::from(dest);
        cmd.arg("--dest").arg(if major == 12 {
            dest
        } else {
            dest.join(format!("cuda{major}"))
        });
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run python3 {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}). It downloads NVIDIA's headers from PyPI: this test needs network \
             access the first time (CI has it), or a populated cache (.nvidia-headers).\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(PathBuf::from)
        .collect();
    match dirs.iter().find(|d| !d.is_dir()) {
        Some(d) => Err(format!("{} is not a directory", d.display())),
        None if dirs.is_empty() => Err("the fetch script printed no include directory".into()),
        None => Ok(dirs),
    }
}

// ---- C types ------------------------------------------------------------------------------

/// A C type, built from a Rust type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CType {
    /// `void`.
    Void,
    /// A type name: `int`, `size_t`, `struct CUstream_st`, `ncclUniqueId`.
    Named(String),
    /// `T const`.
    Const(Box<CType>),
    /// `T *`.
    Ptr(Box<CType>),
    /// `T [n]`.
    Array(Box<CType>, u64),
    /// A function type (only behind `Ptr`).
    Fn {
        /// Return type.
        ret: Box<CType>,
        /// Parameter types.
        params: Vec<CType>,
    },
}

impl CType {
    /// A C declaration of `name` with this type (`name` empty: an abstract declarator).
    pub fn declare(&self, name: &str) -> String {
        match self {
            CType::Void => join("void", name),
            CType::Named(n) => join(n, name),
            CType::Const(t) => t.declare(&join("const", name)),
            CType::Ptr(t) => {
                let needs_parens = matches!(strip_const(t), CType::Fn { .. } | CType::Array(..));
                let d = if needs_parens {
                    format!("(*{name})")
                } else {
                    join("*", name)
                };
                t.declare(&d)
            }
            CType::Array(t, n) => t.declare(&format!("{name}[{n}]")),
            CType::Fn { ret, params } => {
                let ps = if params.is_empty() {
                    "void".to_string()
                } else {
                    params
                        .iter()
                        .map(|p| p.declare(""))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                ret.declare(&format!("{name}({ps})"))
            }
        }
    }
}

fn strip_const(t: &CType) -> &CType {
    match t {
        CType::Const(inner) => strip_const(inner),
        other => other,
    }
}

fn join(a: &str, b: &str) -> String {
    if b.is_empty() {
        a.to_string()
    } else {
        format!("{a} {b}")
    }
}

/// The C type of a Rust primitive (`core::ffi`, `std::os::raw`, `libc` or a fixed-width type).
pub fn c_primitive(name: &str) -> Option<&'static str> {
    Some(match name {
        "c_void" => "void",
        "c_char" => "char",
        "c_schar" => "signed char",
        "c_uchar" => "unsigned char",
        "c_short" => "short",
        "c_ushort" => "unsigned short",
        "c_int" => "int",
        "c_uint" => "unsigned int",
        "c_long" => "long",
        "c_ulong" => "unsigned long",
        "c_longlong" => "long long",
        "c_ulonglong" => "unsigned long long",
        "c_float" | "f32" => "float",
        "c_double" | "f64" => "double",
        "size_t" | "usize" => "size_t",
        "ssize_t" => "ssize_t",
        "isize" => "ptrdiff_t",
        "i8" => "int8_t",
        "u8" => "uint8_t",
        "i16" => "int16_t",
        "u16" => "uint16_t",
        "i32" => "int32_t",
        "u32" => "uint32_t",
        "i64" => "int64_t",
        "u64" => "uint64_t",
        "bool" => "_Bool",
        _ => return None,
    })
}

/// How a Rust struct or union of `cuda-abi` is spelled in C (see [`C_TYPEDEF_NAMES`]).
pub fn c_spelling(name: &str, is_union: bool) -> String {
    let tagged =
        C_TAGS.contains(&name) || (!name.ends_with("_t") && !C_TYPEDEF_NAMES.contains(&name));
    if tagged {
        format!("{} {name}", if is_union { "union" } else { "struct" })
    } else {
        name.to_string()
    }
}

// ---- cuda-abi -----------------------------------------------------------------------------

/// A `#[repr(C)]` struct or union of `cuda-abi`.
#[derive(Clone)]
pub struct Record {
    /// Rust name (the C tag or typedef name).
    pub name: String,
    /// `union` rather than `struct`.
    pub is_union: bool,
    /// Fields: C name (Rust name without `r#` or a keyword-avoiding trailing `_`) and type.
    pub fields: Vec<(String, syn::Type)>,
    /// Source file.
    pub file: PathBuf,
    /// `#[repr(C, align(N))]`: the alignment the C type declares (CUDA's `float2` is
    /// `__builtin_align__(8)`).
    pub align: Option<u64>,
}

/// The types of `cuda-abi`, as parsed from its sources.
#[derive(Clone, Default)]
pub struct AbiTypes {
    /// `pub type X = T;`
    pub aliases: HashMap<String, syn::Type>,
    /// `#[repr(C)]` structs and unions with fields.
    pub records: BTreeMap<String, Record>,
    /// Opaque structs (handle pointees).
    pub opaque: HashSet<String>,
    /// Integer constants (for array lengths).
    pub consts: HashMap<String, u64>,
}

/// Rust keywords that a field named after a C member must avoid (`type_` for C's `type`).
const RUST_KEYWORDS: [&str; 12] = [
    "type", "fn", "struct", "enum", "union", "match", "mod", "ref", "loop", "move", "impl", "use",
];

fn c_field_name(ident: &syn::Ident) -> String {
    let s = ident.unraw().to_string();
    match s.strip_suffix('_') {
        Some(base) if RUST_KEYWORDS.contains(&base) => base.to_string(),
        _ => s,
    }
}

fn is_repr_c(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("repr") && {
            let mut c = false;
            let _ = a.parse_nested_meta(|m| {
                c |= m.path.is_ident("C");
                Ok(())
            });
            c
        }
    })
}

/// N of `#[repr(C, align(N))]`.
fn repr_align(attrs: &[syn::Attribute]) -> Option<u64> {
    let mut n = None;
    for a in attrs.iter().filter(|a| a.path().is_ident("repr")) {
        let _ = a.parse_nested_meta(|m| {
            if m.path.is_ident("align") {
                let content;
                syn::parenthesized!(content in m.input);
                n = content.parse::<syn::LitInt>()?.base10_parse().ok();
            }
            Ok(())
        });
    }
    n
}

thread_local! {
    /// The CUDA major whose sources are read: `cfg(sim_cuda13)` holds for 13 (the CUDA 13
    /// build of the simulated stack; see tests/sim/build_sim_lib.rs). Per thread: the
    /// integration tests are one binary whose tests run on parallel threads, each checking one
    /// major.
    static CUDA_MAJOR: std::cell::Cell<u32> = const { std::cell::Cell::new(12) };
}

/// Selects the CUDA major (12 or 13) whose `cfg`s [`parse_exports`] and [`AbiTypes::parse`]
/// evaluate on this thread.
pub fn set_cuda_major(major: u32) {
    CUDA_MAJOR.with(|m| m.set(major));
}

/// The CUDA major set by [`set_cuda_major`] on this thread (12 by default).
pub fn cuda_major() -> u32 {
    CUDA_MAJOR.with(|m| m.get())
}

/// The simulated libraries of the selected CUDA major: CUDA 13 has no NVTX v2 library
/// (`nvToolsExt.h` is gone; NVTX 3 is header-only).
pub fn sim_libraries() -> Vec<&'static str> {
    SIM_LIBRARIES
        .into_iter()
        .filter(|l| cuda_major() == 12 || *l != "nvtx")
        .collect()
}

/// Evaluates a `#[cfg(...)]` predicate for the host target (the one gcc compiles for):
/// `target_arch`, `target_os`, `target_pointer_width`, `unix`, `test` and `all/any/not`.
fn cfg_holds(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(p) => {
            p.is_ident("unix") || (p.is_ident("sim_cuda13") && cuda_major() == 13)
        }
        syn::Meta::NameValue(nv) => {
            let value = match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => s.value(),
                _ => return false,
            };
            if nv.path.is_ident("target_arch") {
                value == std::env::consts::ARCH
            } else if nv.path.is_ident("target_os") {
                value == std::env::consts::OS
            } else if nv.path.is_ident("target_pointer_width") {
                value == (usize::BITS).to_string()
            } else {
                false
            }
        }
        syn::Meta::List(l) => {
            let Ok(args) = l.parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            ) else {
                return false;
            };
            if l.path.is_ident("all") {
                args.iter().all(cfg_holds)
            } else if l.path.is_ident("any") {
                args.iter().any(cfg_holds)
            } else if l.path.is_ident("not") {
                !args.iter().any(cfg_holds)
            } else {
                false
            }
        }
    }
}

/// Whether the item is compiled for the host (no `#[cfg]`, or one that holds).
fn cfg_enabled(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .all(|a| a.parse_args::<syn::Meta>().is_ok_and(|m| cfg_holds(&m)))
}

fn eval_int(e: &syn::Expr, consts: &HashMap<String, u64>) -> Option<u64> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().ok(),
        syn::Expr::Path(p) => consts
            .get(&p.path.segments.last()?.ident.to_string())
            .copied(),
        syn::Expr::Paren(p) => eval_int(&p.expr, consts),
        syn::Expr::Group(g) => eval_int(&g.expr, consts),
        syn::Expr::Cast(c) => eval_int(&c.expr, consts),
        syn::Expr::Binary(b) => {
            let (l, r) = (eval_int(&b.left, consts)?, eval_int(&b.right, consts)?);
            match b.op {
                syn::BinOp::Add(_) => l.checked_add(r),
                syn::BinOp::Sub(_) => l.checked_sub(r),
                syn::BinOp::Mul(_) => l.checked_mul(r),
                syn::BinOp::Shl(_) => l.checked_shl(u32::try_from(r).ok()?),
                syn::BinOp::BitOr(_) => Some(l | r),
                _ => None,
            }
        }
        _ => None,
    }
}

impl AbiTypes {
    /// Parses every `*.rs` file directly in `abi_src` (the `cuda-abi` crate's `src`).
    pub fn parse(abi_src: &Path) -> Result<Self, String> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(abi_src)
            .map_err(|e| format!("{}: {e}", abi_src.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            // CUDA 13 headers have no NVTX v2 types (see `sim_libraries`).
            .filter(|p| cuda_major() == 12 || !p.ends_with("nvtx.rs"))
            .collect();
        files.sort();
        let mut abi = AbiTypes::default();
        let mut const_exprs = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", f.display()))?;
            abi.collect(&ast.items, f, &mut const_exprs)?;
        }
        // Constants may refer to each other: evaluate until nothing changes.
        loop {
            let before = abi.consts.len();
            for (name, expr) in &const_exprs {
                if !abi.consts.contains_key(name) {
                    if let Some(v) = eval_int(expr, &abi.consts) {
                        abi.consts.insert(name.clone(), v);
                    }
                }
            }
            if abi.consts.len() == before {
                break;
            }
        }
        Ok(abi)
    }

    fn collect(
        &mut self,
        items: &[syn::Item],
        file: &Path,
        const_exprs: &mut Vec<(String, syn::Expr)>,
    ) -> Result<(), String> {
        for item in items {
            match item {
                syn::Item::Type(t) if cfg_enabled(&t.attrs) => {
                    let name = t.ident.to_string();
                    if let Some(prev) = self.aliases.insert(name.clone(), (*t.ty).clone()) {
                        if quote_tokens(&prev) != quote_tokens(&*t.ty) {
                            return Err(format!("{}: type `{name}` defined twice", file.display()));
                        }
                    }
                }
                syn::Item::Struct(s) if cfg_enabled(&s.attrs) && is_repr_c(&s.attrs) => {
                    let fields: Vec<_> = s
                        .fields
                        .iter()
                        .filter(|f| cfg_enabled(&f.attrs))
                        .filter_map(|f| Some((f.ident.as_ref()?, f.ty.clone())))
                        .collect();
                    // opaque_struct!'s shape: no fields, or one zero-length array.
                    let opaque = fields.is_empty()
                        || (fields.len() == 1
                            && matches!(&fields[0].1, syn::Type::Array(a)
                                if eval_int(&a.len, &HashMap::new()) == Some(0)));
                    if opaque {
                        self.opaque.insert(s.ident.to_string());
                    } else {
                        self.add_record(&s.ident, false, fields, file);
                        if let Some(r) = self.records.get_mut(&s.ident.to_string()) {
                            r.align = repr_align(&s.attrs);
                        }
                    }
                }
                syn::Item::Union(u) if cfg_enabled(&u.attrs) && is_repr_c(&u.attrs) => {
                    let fields = u
                        .fields
                        .named
                        .iter()
                        .filter(|f| cfg_enabled(&f.attrs))
                        .filter_map(|f| Some((f.ident.as_ref()?, f.ty.clone())))
                        .collect();
                    self.add_record(&u.ident, true, fields, file);
                }
                syn::Item::Const(c) if cfg_enabled(&c.attrs) => {
                    const_exprs.push((c.ident.to_string(), (*c.expr).clone()));
                }
                syn::Item::Macro(m)
                    if m.mac
                        .path
                        .segments
                        .last()
                        .is_some_and(|s| s.ident == "opaque_struct") =>
                {
                    // opaque_struct!( #[attrs] Name ): the name is the last identifier.
                    let name = m
                        .mac
                        .tokens
                        .clone()
                        .into_iter()
                        .filter_map(|t| match t {
                            proc_macro2::TokenTree::Ident(i) => Some(i.to_string()),
                            _ => None,
                        })
                        .last()
                        .ok_or_else(|| format!("{}: empty opaque_struct!", file.display()))?;
                    self.opaque.insert(name);
                }
                syn::Item::Mod(m) if cfg_enabled(&m.attrs) => {
                    if let Some((_, items)) = &m.content {
                        self.collect(items, file, const_exprs)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn add_record(
        &mut self,
        ident: &syn::Ident,
        is_union: bool,
        fields: Vec<(&syn::Ident, syn::Type)>,
        file: &Path,
    ) {
        let name = ident.to_string();
        let fields = fields
            .into_iter()
            .map(|(i, t)| (c_field_name(i), t))
            .collect();
        self.records.insert(
            name.clone(),
            Record {
                name,
                is_union,
                fields,
                file: file.to_path_buf(),
                align: None,
            },
        );
    }

    /// The C type of a Rust type, by ABI.
    pub fn c_type(&self, ty: &syn::Type) -> Result<CType, String> {
        self.c_type_at(ty, 0)
    }

    fn c_type_at(&self, ty: &syn::Type, depth: usize) -> Result<CType, String> {
        if depth > 64 {
            return Err("type aliases nest too deeply (a cycle?)".into());
        }
        match ty {
            syn::Type::Ptr(p) => {
                let inner = self.c_type_at(&p.elem, depth + 1)?;
                Ok(CType::Ptr(Box::new(if p.mutability.is_some() {
                    inner
                } else {
                    CType::Const(Box::new(inner))
                })))
            }
            syn::Type::Paren(p) => self.c_type_at(&p.elem, depth + 1),
            syn::Type::Group(g) => self.c_type_at(&g.elem, depth + 1),
            syn::Type::Tuple(t) if t.elems.is_empty() => Ok(CType::Void),
            syn::Type::BareFn(f) => self.fn_pointer(f, depth),
            syn::Type::Array(a) => {
                let n = eval_int(&a.len, &self.consts).ok_or_else(|| {
                    format!(
                        "array length `{}` is not a known constant",
                        quote_tokens(&a.len)
                    )
                })?;
                Ok(CType::Array(
                    Box::new(self.c_type_at(&a.elem, depth + 1)?),
                    n,
                ))
            }
            syn::Type::Path(p) if p.qself.is_none() => {
                let seg = p.path.segments.last().ok_or("empty type path")?;
                let name = seg.ident.to_string();
                if name == "Option" {
                    // Option<extern "C" fn(..)>: a nullable function pointer.
                    if let syn::PathArguments::AngleBracketed(args) = &seg.arguments {
                        if let Some(syn::GenericArgument::Type(inner)) = args.args.first() {
                            let inner = self.c_type_at(inner, depth + 1)?;
                            if matches!(&inner, CType::Ptr(f) if matches!(**f, CType::Fn { .. })) {
                                return Ok(inner);
                            }
                        }
                    }
                    return Err(format!(
                        "`{}`: only Option<extern \"C\" fn> has a C ABI",
                        quote_tokens(ty)
                    ));
                }
                if !seg.arguments.is_empty() {
                    return Err(format!("generic type `{}` has no C ABI", quote_tokens(ty)));
                }
                if let Some(c) = c_primitive(&name) {
                    return Ok(if c == "void" {
                        CType::Void
                    } else {
                        CType::Named(c.to_string())
                    });
                }
                if C_BUILTIN_TYPEDEFS.contains(&name.as_str()) {
                    return Ok(CType::Named(name));
                }
                if let Some(def) = self.aliases.get(&name) {
                    return self.c_type_at(def, depth + 1);
                }
                if let Some(r) = self.records.get(&name) {
                    return Ok(CType::Named(c_spelling(&name, r.is_union)));
                }
                if self.opaque.contains(&name) {
                    return Ok(CType::Named(c_spelling(&name, false)));
                }
                Err(format!(
                    "unknown type `{name}` (not a primitive nor a cuda-abi type)"
                ))
            }
            other => Err(format!(
                "type `{}` has no C equivalent",
                quote_tokens(other)
            )),
        }
    }

    fn fn_pointer(&self, f: &syn::TypeBareFn, depth: usize) -> Result<CType, String> {
        check_abi(f.abi.as_ref())?;
        if f.variadic.is_some() {
            return Err("variadic function pointers are not supported".into());
        }
        let params = f
            .inputs
            .iter()
            .map(|a| self.c_type_at(&a.ty, depth + 1))
            .collect::<Result<Vec<_>, _>>()?;
        let ret = match &f.output {
            syn::ReturnType::Default => CType::Void,
            syn::ReturnType::Type(_, t) => self.c_type_at(t, depth + 1)?,
        };
        Ok(CType::Ptr(Box::new(CType::Fn {
            ret: Box::new(ret),
            params,
        })))
    }

    /// The C function type of an exported function's signature.
    pub fn fn_type(&self, sig: &syn::Signature) -> Result<CType, String> {
        check_abi(sig.abi.as_ref())?;
        if sig.variadic.is_some() {
            return Err("variadic exports are not supported".into());
        }
        let mut params = Vec::new();
        for (i, arg) in sig.inputs.iter().enumerate() {
            match arg {
                syn::FnArg::Typed(pt) => params.push(
                    self.c_type(&pt.ty)
                        .map_err(|e| format!("parameter {}: {e}", i + 1))?,
                ),
                syn::FnArg::Receiver(_) => return Err("`self` parameter".into()),
            }
        }
        let ret = match &sig.output {
            syn::ReturnType::Default => CType::Void,
            syn::ReturnType::Type(_, t) => {
                self.c_type(t).map_err(|e| format!("return type: {e}"))?
            }
        };
        Ok(CType::Fn {
            ret: Box::new(ret),
            params,
        })
    }
}

fn check_abi(abi: Option<&syn::Abi>) -> Result<(), String> {
    match abi {
        Some(syn::Abi { name: None, .. }) => Ok(()),
        Some(syn::Abi { name: Some(n), .. }) if n.value() == "C" || n.value() == "C-unwind" => {
            Ok(())
        }
        Some(syn::Abi { name: Some(n), .. }) => Err(format!("ABI \"{}\" is not C", n.value())),
        None => Err("not an extern \"C\" function".into()),
    }
}

fn quote_tokens(t: &impl quote::ToTokens) -> String {
    t.to_token_stream().to_string()
}

// ---- exports ------------------------------------------------------------------------------

/// An `extern "C"` function a simulated library exports.
#[derive(Clone)]
pub struct Export {
    /// The symbol.
    pub name: String,
    /// The library (directory under `tests/sim`).
    pub library: String,
    /// Source file.
    pub file: PathBuf,
    /// The Rust signature.
    pub sig: syn::Signature,
}

/// Whether a symbol is a private interface between the simulated libraries (not checked).
pub fn is_private(symbol: &str) -> bool {
    symbol.starts_with("__sim")
}

/// The exported name of a function: `#[no_mangle]` (also `#[unsafe(no_mangle)]`) or
/// `#[export_name = "..."]`.
fn export_name(f: &syn::ItemFn) -> Option<String> {
    for a in &f.attrs {
        let p = a.path();
        if p.is_ident("no_mangle") {
            return Some(f.sig.ident.unraw().to_string());
        }
        if p.is_ident("export_name") {
            if let syn::Meta::NameValue(nv) = &a.meta {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
                {
                    return Some(s.value());
                }
            }
        }
        if p.is_ident("unsafe") {
            let mut found = None;
            let _ = a.parse_nested_meta(|m| {
                if m.path.is_ident("no_mangle") {
                    found = Some(f.sig.ident.unraw().to_string());
                } else if m.path.is_ident("export_name") {
                    found = Some(m.value()?.parse::<syn::LitStr>()?.value());
                }
                Ok(())
            });
            if found.is_some() {
                return found;
            }
        }
    }
    None
}

struct ExportVisitor<'a> {
    library: &'a str,
    file: &'a Path,
    out: Vec<Export>,
}

impl<'ast> Visit<'ast> for ExportVisitor<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !cfg_enabled(&f.attrs) {
            return;
        }
        if let Some(name) = export_name(f) {
            self.out.push(Export {
                name,
                library: self.library.to_string(),
                file: self.file.to_path_buf(),
                sig: f.sig.clone(),
            });
        }
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // `#[cfg(test)]` modules are not part of the library.
        if cfg_enabled(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in rd {
        let p = e.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if p.is_dir() {
            rust_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// Every `extern "C"` export (private `__sim*` ones included) of the simulated libraries under
/// `sim_root` (`tests/sim`), sorted by library and name.
pub fn parse_exports(sim_root: &Path) -> Result<Vec<Export>, String> {
    let mut all = Vec::new();
    for lib in sim_libraries() {
        let mut files = Vec::new();
        rust_files(&sim_root.join(lib).join("src"), &mut files)?;
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", f.display()))?;
            let mut v = ExportVisitor {
                library: lib,
                file: &f,
                out: Vec::new(),
            };
            v.visit_file(&ast);
            all.extend(v.out);
        }
    }
    all.sort_by(|a, b| (&a.library, &a.name).cmp(&(&b.library, &b.name)));
    Ok(all)
}

/// The entry points `cuda-dyn` declares with `dyn_api! { fn name(args) -> ret; ... }` in the
/// modules of `cuda_dyn_src` (its `src`), as exports of library `cuda-dyn/<module>` with the C
/// ABI: they are called through pointers of that type, so they must match the headers too.
pub fn parse_dyn_api(cuda_dyn_src: &Path) -> Result<Vec<Export>, String> {
    struct Decls(Vec<syn::ForeignItemFn>);
    impl syn::parse::Parse for Decls {
        fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
            let mut v = Vec::new();
            while !input.is_empty() {
                v.push(input.parse()?);
            }
            Ok(Decls(v))
        }
    }
    let mut files = Vec::new();
    rust_files(cuda_dyn_src, &mut files)?;
    files.sort();
    let mut all = Vec::new();
    for f in files {
        let module = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        for item in &ast.items {
            let syn::Item::Macro(m) = item else { continue };
            if m.mac
                .path
                .segments
                .last()
                .is_none_or(|s| s.ident != "dyn_api")
            {
                continue;
            }
            let decls: Decls = m
                .mac
                .parse_body()
                .map_err(|e| format!("{}: dyn_api! body: {e}", f.display()))?;
            for d in decls.0 {
                let mut sig = d.sig;
                sig.abi = Some(syn::parse_quote!(extern "C"));
                // `-> ()` is the macro's spelling of `void`.
                all.push(Export {
                    name: sig.ident.unraw().to_string(),
                    library: format!("cuda-dyn/{module}"),
                    file: f.clone(),
                    sig,
                });
            }
        }
    }
    Ok(all)
}

/// The functions a shared library exports (`nm -D --defined-only`).
pub fn dynamic_symbols(lib: &Path) -> Result<Vec<String>, String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(lib)
        .output()
        .map_err(|e| format!("cannot run nm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nm {} failed: {}",
            lib.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut syms: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (name, kind) = (it.next()?, it.next()?);
            // Functions only: T/t text, W weak, i indirect.
            matches!(kind, "T" | "W" | "i")
                .then(|| name.split('@').next().unwrap_or(name).to_string())
        })
        .collect();
    syms.sort();
    syms.dedup();
    Ok(syms)
}

// ---- the check ----------------------------------------------------------------------------

/// What a line of generated C checks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    /// An exported function: (library, symbol).
    Export(String, String),
    /// A `cuda-abi` struct or union.
    Record(String),
    /// The headers and the check's own scaffolding (an error here means nothing was checked).
    Headers,
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Export(lib, name) => write!(f, "{name} ({lib})"),
            Subject::Record(name) => write!(f, "struct {name} (cuda-abi)"),
            Subject::Headers => write!(f, "the headers"),
        }
    }
}

/// A check that failed, with the compiler's messages (or the translation error).
#[derive(Clone, Debug)]
pub struct Failure {
    /// What failed.
    pub subject: Subject,
    /// Why.
    pub message: String,
}

/// The outcome of [`check`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Exports found (private `__sim*` excluded).
    pub exports_found: usize,
    /// Exports whose C type matched the header's: "symbol (library)".
    pub exports_checked: Vec<String>,
    /// Structs and unions found.
    pub records_found: usize,
    /// Structs whose layout and field types matched.
    pub records_checked: Vec<String>,
    /// Subjects the C headers do not declare (`#if defined(__cplusplus)`, e.g. the `__half`
    /// API of cuBLAS) that matched in the C++ check instead.
    pub cxx_only: Vec<String>,
    /// Everything that failed.
    pub failures: Vec<Failure>,
    /// The generated C (and C++) files.
    pub c_files: Vec<PathBuf>,
    /// The compilers' combined messages.
    pub gcc_output: String,
}

impl Report {
    /// Whether every export and struct was checked and none failed.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
            && self.exports_checked.len() == self.exports_found
            && self.records_checked.len() == self.records_found
    }

    /// The failures, one block each, for an assertion message.
    pub fn describe_failures(&self) -> String {
        let mut s = String::new();
        for f in &self.failures {
            let _ = writeln!(
                s,
                "* {}:\n    {}",
                f.subject,
                f.message.replace('\n', "\n    ")
            );
        }
        s
    }

    /// Whether some failure is about export `symbol`.
    pub fn fails_export(&self, symbol: &str) -> bool {
        self.failures
            .iter()
            .any(|f| matches!(&f.subject, Subject::Export(_, n) if n == symbol))
    }

    /// Whether some failure is about struct `name`.
    pub fn fails_record(&self, name: &str) -> bool {
        self.failures
            .iter()
            .any(|f| matches!(&f.subject, Subject::Record(n) if n == name))
    }
}

/// The language of a generated file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lang {
    /// C11: the primary check (gcc's C rules make an enum compatible with its integer type).
    C,
    /// C++20: the fallback for declarations the headers make only for C++.
    Cxx,
}

/// A way of including the headers. Each declares some exported names under their own name
/// (the others are hidden behind renaming macros such as `#define cudaMemcpy cudaMemcpy_ptds`
/// or `#define cublasSgemm cublasSgemm_v2`); the check `#undef`s the export's name so that it
/// always compares with the declaration of that very symbol.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum View {
    /// What an application sees: `cuda_runtime_api.h`, `cublas_v2.h`, ...
    Public,
    /// `-DCUDA_API_PER_THREAD_DEFAULT_STREAM`: declares the `_ptds`/`_ptsz` entry points.
    PerThread,
    /// `-D__CUDA_API_VERSION_INTERNAL`, as libcudart itself is built: declares every symbol the
    /// runtime exports under its own name, legacy ABIs included (`cudaStreamGetCaptureInfo`
    /// is the 3-parameter function there; applications are renamed to `..._v2`).
    CudartInternal,
    /// `cublas.h` instead of `cublas_v2.h`: the legacy cuBLAS API (`cublasSgemm` without a
    /// handle), which libcublas also exports.
    CublasLegacy,
    /// C++ (`Public` headers), for declarations made only under `__cplusplus`.
    Cxx,
}

impl View {
    /// The C views, in the order they are reported.
    pub const C_VIEWS: [View; 4] = [
        View::Public,
        View::PerThread,
        View::CudartInternal,
        View::CublasLegacy,
    ];

    fn lang(self) -> Lang {
        if self == View::Cxx {
            Lang::Cxx
        } else {
            Lang::C
        }
    }

    /// A short name, used in file names and messages.
    pub fn name(self) -> &'static str {
        match self {
            View::Public => "public",
            View::PerThread => "per_thread",
            View::CudartInternal => "cudart_internal",
            View::CublasLegacy => "cublas_legacy",
            View::Cxx => "cxx",
        }
    }

    fn defines(self) -> &'static [&'static str] {
        match self {
            View::PerThread => &["CUDA_API_PER_THREAD_DEFAULT_STREAM"],
            View::CudartInternal => &["__CUDA_API_VERSION_INTERNAL"],
            _ => &[],
        }
    }

    fn headers(self) -> Vec<&'static str> {
        let mut h: Vec<&str> = match self.lang() {
            Lang::C => vec!["stddef.h", "stdint.h"],
            // <cstring> and <cmath>: crt/host_runtime.h (see `Unit::new`) uses memcpy and the
            // math functions without including them.
            Lang::Cxx => vec!["cstddef", "cstdint", "type_traits", "cstring", "cmath"],
        };
        if self.lang() == Lang::Cxx {
            // NCCL 2.28+'s host functions of the device API (C++ only; absent before 2.28).
            h.push("nccl_device/core.h");
        }
        for inc in HEADERS {
            // cublasXt.h includes cublas_v2.h, which cublas.h refuses to meet.
            if self == View::CublasLegacy && inc == "cublasXt.h" {
                continue;
            }
            h.push(if self == View::CublasLegacy && inc == "cublas_v2.h" {
                "cublas.h"
            } else {
                inc
            });
        }
        h
    }
}

/// Compares a header's type with the Rust side's by ABI in C++, where an enum is a distinct
/// type: an enum matches its underlying type, pointers and functions compare member-wise, and
/// `const` must agree. Anything else must be the same type.
const CXX_TRAIT: &str = r#"namespace abi_check {
template <class... T> struct list {};
template <class A, class B> struct same : std::is_same<A, B> {};
template <class A, class B> struct same_list : std::false_type {};
template <> struct same_list<list<>, list<>> : std::true_type {};
template <class A, class... As, class B, class... Bs> struct same_list<list<A, As...>, list<B, Bs...>> : std::bool_constant<same<A, B>::value && same_list<list<As...>, list<Bs...>>::value> {};
template <class A, class B> requires (std::is_enum_v<A> && !std::is_const_v<A> && !std::is_enum_v<B>) struct same<A, B> : std::is_same<std::underlying_type_t<A>, B> {};
template <class A, class B> struct same<A *, B *> : same<A, B> {};
template <class A, class B> struct same<const A, const B> : same<A, B> {};
template <class R1, class... P1, class R2, class... P2> struct same<R1(P1...), R2(P2...)> : std::bool_constant<same<R1, R2>::value && same_list<list<P1...>, list<P2...>>::value> {};
}"#;

/// A generated source file: its lines and what each checks.
struct Unit {
    view: View,
    lines: Vec<(String, Subject)>,
}

impl Unit {
    fn new(view: View) -> Self {
        let mut u = Unit {
            view,
            lines: Vec::new(),
        };
        let h = Subject::Headers;
        u.push(
            format!(
                "/* Generated by tests/integration/src/abi_check.rs ({} view): do not edit. */",
                view.name()
            ),
            &h,
        );
        for d in view.defines() {
            u.push(format!("#define {d} 1"), &h);
        }
        u.push("#define NVTX_SUPPRESS_V2_DEPRECATION_WARNING 1".into(), &h);
        for inc in view.headers() {
            // Conditional: CUDA 13 dropped the NVTX v2 headers (nvToolsExt.h). An export that
            // only a missing header declared still fails, as undeclared.
            u.push(format!("#if __has_include(<{inc}>)"), &h);
            u.push(format!("#include <{inc}>"), &h);
            u.push("#endif".into(), &h);
        }
        if view.lang() == Lang::Cxx {
            // nvcc's host-side registration and launch entry points (`__cudaRegisterFunction`,
            // `__cudaPopCallConfiguration`, ...), which libcudart exports for the code nvcc
            // generates: declared by its internal header, which wants this guard.
            u.push(
                "#define __CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__".into(),
                &h,
            );
            u.push("#define __CUDA_INTERNAL_COMPILATION__".into(), &h);
            u.push("#include <crt/host_runtime.h>".into(), &h);
            u.push("#undef __CUDA_INTERNAL_COMPILATION__".into(), &h);
            u.push(
                "#undef __CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__".into(),
                &h,
            );
            for l in CXX_TRAIT.lines() {
                u.push(l.to_string(), &h);
            }
        }
        u
    }

    fn push(&mut self, line: String, subject: &Subject) {
        self.lines.push((line, subject.clone()));
    }

    fn text(&self) -> String {
        let mut s = String::new();
        for (l, _) in &self.lines {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    /// Declares `sim_<id>` with the Rust signature and compares it with the header's
    /// declaration of the symbol `name` itself (`#undef` drops a renaming macro).
    fn export(&mut self, name: &str, id: &str, ty: &CType, subject: &Subject) {
        let sim = format!("sim_{id}");
        self.push(format!("#undef {name}"), subject);
        let line = match self.view.lang() {
            Lang::C => format!(
                "extern {}; static __typeof__(&{name}) const chk_{id} __attribute__((unused)) = &{sim};",
                ty.declare(&sim)
            ),
            Lang::Cxx => format!(
                "extern \"C\" {}; static_assert(abi_check::same<decltype({name}), decltype({sim})>::value, \"{name}: signature differs from the header\");",
                ty.declare(&sim)
            ),
        };
        self.push(line, subject);
    }

    /// A mirror of the Rust record and assertions comparing it with the header's. C++ checks
    /// size and alignment only (members of C++ classes may be private).
    fn record(&mut self, abi: &AbiTypes, r: &Record) -> Result<(), String> {
        let subject = Subject::Record(r.name.clone());
        let c_name = c_spelling(&r.name, r.is_union);
        let kw = if r.is_union { "union" } else { "struct" };
        let mirror = format!("{kw} rs_{}", r.name);
        let mut decl = format!("{mirror} {{");
        for (fname, fty) in &r.fields {
            let ct = abi
                .c_type(fty)
                .map_err(|e| format!("field `{fname}`: {e}"))?;
            let _ = write!(decl, " {};", ct.declare(fname));
        }
        decl.push_str(" }");
        if let Some(n) = r.align {
            let _ = write!(decl, " __attribute__((aligned({n})))");
        }
        decl.push(';');
        self.push(decl, &subject);
        let label = &r.name;
        let lang = self.view.lang();
        let (assert, align) = match lang {
            Lang::C => ("_Static_assert", "_Alignof"),
            Lang::Cxx => ("static_assert", "alignof"),
        };
        self.push(
            format!("{assert}(sizeof({mirror}) == sizeof({c_name}), \"{label}: size differs from the header\");"),
            &subject,
        );
        self.push(
            format!("{assert}({align}({mirror}) == {align}({c_name}), \"{label}: alignment differs from the header\");"),
            &subject,
        );
        if lang == Lang::C {
            // A field named `_...` stands for a part of the C struct the mirror does not name
            // (an anonymous union): the struct's size and alignment check it, nothing else.
            for (fname, _) in r.fields.iter().filter(|(f, _)| !f.starts_with('_')) {
                self.push(
                    format!("{assert}(offsetof({mirror}, {fname}) == offsetof({c_name}, {fname}), \"{label}.{fname}: offset differs from the header\");"),
                    &subject,
                );
                self.push(
                    format!(
                        "{assert}(__builtin_types_compatible_p(__typeof__((({mirror} *)0)->{fname}), __typeof__((({c_name} *)0)->{fname})), \"{label}.{fname}: type differs from the header\");"
                    ),
                    &subject,
                );
            }
        }
        Ok(())
    }

    /// Writes and compiles the unit; returns the subjects with errors and their messages.
    fn compile(
        &self,
        path: &Path,
        include_dirs: &[PathBuf],
        report: &mut Report,
    ) -> Result<Errors, String> {
        std::fs::write(path, self.text())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        report.c_files.push(path.to_path_buf());
        let mut cmd = match self.view.lang() {
            Lang::C => {
                let mut c = Command::new("gcc");
                c.args(["-std=c11", "-x", "c"]);
                c
            }
            Lang::Cxx => {
                let mut c = Command::new("g++");
                c.args(["-std=c++20", "-x", "c++"]);
                c
            }
        };
        cmd.args([
            "-fsyntax-only",
            "-fmax-errors=0",
            "-fno-diagnostics-color",
            "-Werror",
            "-Wno-deprecated-declarations",
        ]);
        if self.view.lang() == Lang::C {
            // An error already under -Werror; named so that no default can weaken it.
            cmd.arg("-Werror=incompatible-pointer-types");
        }
        for d in include_dirs {
            cmd.arg("-I").arg(d);
        }
        // ASCII quotes in messages, whatever the locale.
        cmd.arg(path).env("LC_ALL", "C");
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run the compiler: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        report.gcc_output.push_str(&stderr);
        let mut failed = BTreeMap::new();
        if !out.status.success() {
            attribute_errors(&stderr, path, &self.lines, &mut failed);
            if failed.is_empty() {
                failed.insert(
                    Subject::Headers,
                    vec![format!(
                        "{} failed without an error on a checked line",
                        path.display()
                    )],
                );
            }
        }
        Ok(failed)
    }
}

/// A C identifier made of a label (may contain characters C does not allow).
fn c_ident(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Whether the compiler's messages say that the headers of that view do not declare the
/// exported function or define the struct at all (rather than declaring something else).
fn invisible(subject: &Subject, msgs: &[String]) -> bool {
    let errors = || msgs.iter().filter(|m| m.contains("error:"));
    match subject {
        Subject::Export(_, name) => errors().any(|m| m.contains(&format!("'{name}' undeclared"))),
        Subject::Record(name) => {
            let c = c_spelling(name, false);
            let u = c_spelling(name, true);
            errors().any(|m| {
                [&c, &u].iter().any(|sp| {
                    m.contains(&format!("incomplete type '{sp}'"))
                        || m.contains(&format!("undefined type '{sp}'"))
                        || m.contains(&format!("unknown type name '{sp}'"))
                })
            })
        }
        Subject::Headers => false,
    }
}

/// Builds the unit of `view` for the subjects `wanted` selects, compiles it and returns the
/// subjects with errors.
fn run_view(
    view: View,
    exports: &[(&Export, CType)],
    abi: &AbiTypes,
    wanted: &dyn Fn(&Subject) -> bool,
    out: &Output<'_>,
    report: &mut Report,
) -> Result<Errors, String> {
    let mut unit = Unit::new(view);
    if view == View::Cxx {
        for decl in nvcc_only_declarations(out.include_dirs) {
            unit.push(decl, &Subject::Headers);
        }
    }
    for (e, ty) in exports {
        let subject = Subject::Export(e.library.clone(), e.name.clone());
        if wanted(&subject) {
            let id = c_ident(&format!("{}_{}", e.library, e.name));
            unit.export(&e.name, &id, ty, &subject);
        }
    }
    // Structs are the same in every C view: the public one checks them.
    if matches!(view, View::Public | View::Cxx) {
        for r in abi.records.values() {
            if wanted(&Subject::Record(r.name.clone())) {
                // Translation errors were reported before.
                let _ = unit.record(abi, r);
            }
        }
    }
    let ext = match view.lang() {
        Lang::C => "c",
        Lang::Cxx => "cc",
    };
    let path = out
        .work_dir
        .join(format!("abi_check_{}_{}.{ext}", out.tag, view.name()));
    unit.compile(&path, out.include_dirs, report)
}

/// nvcc's launch entry points, declared by NVIDIA only for nvcc (`#ifdef __CUDACC__` in
/// crt/device_functions.h, as `__host__ __device__` with default arguments):
/// `__cudaPushCallConfiguration` (what `kernel<<<...>>>` calls) and, from CUDA 12.x/13,
/// `__cudaGetKernel` / `__cudaLaunchKernel`.
pub const NVCC_ONLY: [&str; 3] = [
    "__cudaPushCallConfiguration",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
];

/// The declarations of [`NVCC_ONLY`] present in the headers, taken from crt/device_functions.h
/// as text with the nvcc-only parts removed, so that those exports are still compared with
/// NVIDIA's own signatures.
fn nvcc_only_declarations(include_dirs: &[PathBuf]) -> Vec<String> {
    let Some(text) = include_dirs
        .iter()
        .find_map(|d| std::fs::read_to_string(d.join("crt/device_functions.h")).ok())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in NVCC_ONLY {
        let Some(at) = text.find(&format!("{name}(")) else {
            continue;
        };
        let Some(start) = text[..at].rfind("extern \"C\"") else {
            continue;
        };
        let Some(end) = text[at..].find(';').map(|e| at + e) else {
            continue;
        };
        let mut decl = text[start..=end]
            .replace("__host__", "")
            .replace("__device__", "");
        // Default arguments (`size_t sharedMem = 0`) are C++ declarations' business only.
        while let Some(eq) = decl.find(" = ") {
            let stop = decl[eq..].find([',', ')']).map_or(decl.len(), |i| eq + i);
            decl.replace_range(eq..stop, "");
        }
        out.push(decl.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    out
}

/// Compiler messages per subject.
type Errors = BTreeMap<Subject, Vec<String>>;

/// Where the generated files go and what they include.
struct Output<'a> {
    include_dirs: &'a [PathBuf],
    work_dir: &'a Path,
    tag: &'a str,
}

/// Checks `exports` and every struct of `abi` against the headers in `include_dirs`. The
/// generated files go to `work_dir` (created), named after `tag`.
///
/// Every export is compiled in each C [`View`]. It passes when at least one view declares the
/// symbol and every view that declares it agrees with the Rust signature. An export no C view
/// declares, and a struct C does not define, is compiled as C++ instead (listed in
/// [`Report::cxx_only`] when it passes).
pub fn check(
    exports: &[Export],
    abi: &AbiTypes,
    include_dirs: &[PathBuf],
    work_dir: &Path,
    tag: &str,
) -> Report {
    let mut report = Report::default();
    let mut translated = Vec::new();
    let mut untranslatable: HashSet<Subject> = HashSet::new();
    for e in exports.iter().filter(|e| !is_private(&e.name)) {
        report.exports_found += 1;
        match abi.fn_type(&e.sig) {
            Ok(t) => translated.push((e, t)),
            Err(msg) => {
                let subject = Subject::Export(e.library.clone(), e.name.clone());
                untranslatable.insert(subject.clone());
                report.failures.push(Failure {
                    subject,
                    message: format!(
                        "{}: cannot translate the signature: {msg}",
                        e.file.display()
                    ),
                });
            }
        }
    }
    for r in abi.records.values() {
        report.records_found += 1;
        for (fname, fty) in &r.fields {
            if let Err(msg) = abi.c_type(fty) {
                let subject = Subject::Record(r.name.clone());
                untranslatable.insert(subject.clone());
                report.failures.push(Failure {
                    subject,
                    message: format!("{}: field `{fname}`: {msg}", r.file.display()),
                });
                break;
            }
        }
    }
    let mut subjects: Vec<Subject> = translated
        .iter()
        .map(|(e, _)| Subject::Export(e.library.clone(), e.name.clone()))
        .collect();
    subjects.extend(
        abi.records
            .keys()
            .map(|n| Subject::Record(n.clone()))
            .filter(|s| !untranslatable.contains(s)),
    );

    let out = Output {
        include_dirs,
        work_dir,
        tag,
    };
    let outcome = (|| -> Result<(Errors, HashSet<Subject>), String> {
        std::fs::create_dir_all(work_dir)
            .map_err(|e| format!("cannot create {}: {e}", work_dir.display()))?;
        let in_c = |s: &Subject| !untranslatable.contains(s);
        let mut per_view = Vec::new();
        for view in View::C_VIEWS {
            let f = run_view(view, &translated, abi, &in_c, &out, &mut report)?;
            if let Some(m) = f.get(&Subject::Headers) {
                let mut failed = BTreeMap::new();
                failed.insert(
                    Subject::Headers,
                    m.iter()
                        .map(|l| format!("[{} view] {l}", view.name()))
                        .collect(),
                );
                return Ok((failed, HashSet::new()));
            }
            per_view.push((view, f));
        }
        let mut failed: BTreeMap<Subject, Vec<String>> = BTreeMap::new();
        let mut to_cxx = HashSet::new();
        for s in &subjects {
            let mut declared = false;
            let mut mismatches = Vec::new();
            let mut unseen = Vec::new();
            for (view, f) in &per_view {
                let is_record = matches!(s, Subject::Record(_));
                if is_record && *view != View::Public {
                    continue;
                }
                match f.get(s) {
                    None => declared = true,
                    Some(m) if invisible(s, m) => {
                        unseen.extend(m.iter().map(|l| format!("[{} view] {l}", view.name())))
                    }
                    Some(m) => {
                        declared = true;
                        mismatches.extend(m.iter().map(|l| format!("[{} view] {l}", view.name())));
                    }
                }
            }
            if !mismatches.is_empty() {
                // gcc's C makes an enum compatible with its integer type by value only: behind
                // a pointer (`const cublasOperation_t transa_array[]`) C++ decides, member-wise.
                if mismatches
                    .iter()
                    .all(|m| m.contains("incompatible-pointer-types"))
                {
                    to_cxx.insert(s.clone());
                }
                failed.insert(s.clone(), mismatches);
            } else if !declared {
                failed.insert(s.clone(), unseen);
                to_cxx.insert(s.clone());
            }
        }
        let mut rescued = HashSet::new();
        if !to_cxx.is_empty() {
            let wanted = |s: &Subject| to_cxx.contains(s);
            let cxx = run_view(View::Cxx, &translated, abi, &wanted, &out, &mut report)?;
            if let Some(m) = cxx.get(&Subject::Headers) {
                failed.insert(Subject::Headers, m.clone());
            }
            for s in &to_cxx {
                match cxx.get(s) {
                    None => {
                        failed.remove(s);
                        rescued.insert(s.clone());
                    }
                    Some(m) => {
                        let msgs = failed.entry(s.clone()).or_default();
                        msgs.push("--- no C view declares it; as C++:".into());
                        msgs.extend(m.iter().cloned());
                    }
                }
            }
        }
        Ok((failed, rescued))
    })();
    let (failed, rescued) = match outcome {
        Ok(r) => r,
        Err(msg) => {
            report.failures.push(Failure {
                subject: Subject::Headers,
                message: msg,
            });
            return report;
        }
    };
    let headers_broken = failed.contains_key(&Subject::Headers);
    for s in &subjects {
        if headers_broken || failed.contains_key(s) {
            continue;
        }
        match s {
            Subject::Export(..) => report.exports_checked.push(s.to_string()),
            Subject::Record(name) => report.records_checked.push(name.clone()),
            Subject::Headers => {}
        }
        if rescued.contains(s) {
            report.cxx_only.push(s.to_string());
        }
    }
    for (subject, msgs) in failed {
        report.failures.push(Failure {
            subject,
            message: msgs.join("\n"),
        });
    }
    report
}

/// Maps the compiler's `file:line:col: error: ...` lines back to what the line checks. Errors
/// located elsewhere (in a header) go to [`Subject::Headers`]; notes join the last error.
fn attribute_errors(
    stderr: &str,
    path: &Path,
    lines: &[(String, Subject)],
    failed: &mut BTreeMap<Subject, Vec<String>>,
) {
    let ours = path.to_string_lossy();
    let mut last: Option<Subject> = None;
    for line in stderr.lines() {
        let located = line
            .strip_prefix(ours.as_ref())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(ln, _)| ln.parse::<usize>().ok());
        let is_error = line.contains(": error:") || line.contains(": fatal error:");
        if is_error {
            let subject = located
                .and_then(|ln| lines.get(ln.wrapping_sub(1)))
                .map(|(_, s)| s.clone())
                .unwrap_or(Subject::Headers);
            failed
                .entry(subject.clone())
                .or_default()
                .push(line.to_string());
            last = Some(subject);
        } else if line.contains(": note:") {
            // "expected X but argument is of type Y", "declared here": they explain the error.
            if let Some(s) = &last {
                failed.entry(s.clone()).or_default().push(line.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn abi() -> AbiTypes {
        AbiTypes::parse(&repo_root().join("abi/src")).expect("cuda-abi parses")
    }

    fn c(abi: &AbiTypes, ty: &str) -> String {
        let t: syn::Type = syn::parse_str(ty).expect("a Rust type");
        abi.c_type(&t).expect("translates").declare("x")
    }

    #[test]
    fn primitives_pointers_and_aliases_translate_by_abi() {
        let abi = abi();
        assert_eq!(c(&abi, "c_int"), "int x");
        assert_eq!(c(&abi, "core::ffi::c_longlong"), "long long x");
        assert_eq!(c(&abi, "usize"), "size_t x");
        assert_eq!(c(&abi, "*mut *mut c_void"), "void * * x");
        assert_eq!(c(&abi, "*const c_void"), "void const * x");
        assert_eq!(c(&abi, "*const *const c_char"), "char const * const * x");
        assert_eq!(c(&abi, "cudaError_t"), "unsigned int x");
        assert_eq!(c(&abi, "cudaStream_t"), "struct CUstream_st * x");
        assert_eq!(c(&abi, "*mut cudaDeviceProp"), "struct cudaDeviceProp * x");
        assert_eq!(c(&abi, "cudaHostFn_t"), "void (*x)(void *)");
        assert_eq!(
            c(&abi, "Option<unsafe extern \"C\" fn(c_int) -> *mut c_char>"),
            "char * (*x)(int)"
        );
        assert_eq!(c(&abi, "[[c_int; 3]; 2]"), "int x[2][3]");
        assert_eq!(c(&abi, "*mut [u8; 4]"), "uint8_t (*x)[4]");
        assert_eq!(c(&abi, "*const wchar_t"), "wchar_t const * x");
        assert_eq!(
            c(&abi, "nvtxEventAttributes_t"),
            "struct nvtxEventAttributes_v2 x"
        );
    }

    #[test]
    fn c_spellings() {
        assert_eq!(c_spelling("CUstream_st", false), "struct CUstream_st");
        assert_eq!(c_spelling("payload_t", true), "union payload_t");
        assert_eq!(c_spelling("ncclUniqueId", false), "ncclUniqueId");
        assert_eq!(
            c_spelling("cublasLtMatmulDescOpaque_t", false),
            "cublasLtMatmulDescOpaque_t"
        );
    }

    #[test]
    fn unknown_types_are_errors() {
        let abi = abi();
        let t: syn::Type = syn::parse_str("NoSuchType").expect("a Rust type");
        assert!(abi.c_type(&t).is_err());
        let t: syn::Type = syn::parse_str("Vec<u8>").expect("a Rust type");
        assert!(abi.c_type(&t).is_err());
    }

    #[test]
    fn cfg_predicates() {
        let m: syn::Meta =
            syn::parse_str(&format!("target_arch = \"{}\"", std::env::consts::ARCH)).expect("meta");
        assert!(cfg_holds(&m));
        let m: syn::Meta = syn::parse_str("not(target_arch = \"no-such-arch\")").expect("meta");
        assert!(cfg_holds(&m));
        let m: syn::Meta = syn::parse_str("test").expect("meta");
        assert!(!cfg_holds(&m));
    }
}

/// One C function declaration of a header: its name and its parameters as written (whitespace
/// collapsed), e.g. `const float* x`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// The function's name.
    pub name: String,
    /// Each parameter's declaration (`void` alone: none).
    pub params: Vec<String>,
}

/// The functions returning `ret` whose names start with `prefix` that `header` declares once
/// preprocessed as C with the include directories `include` and the macros `defines` defined
/// (`CUDA_API_PER_THREAD_DEFAULT_STREAM`: the per-thread default stream's spellings; macros
/// such as `CUBLASWINAPI` expanded, conditional declarations resolved as a C compiler sees
/// them).
pub fn declarations(
    include: &[PathBuf],
    header: &str,
    defines: &[&str],
    ret: &str,
    prefix: &str,
) -> Result<Vec<Declaration>, String> {
    use std::io::Write;
    let mut cmd = Command::new("cc");
    cmd.args(["-E", "-P", "-x", "c", "-"]);
    for d in include {
        cmd.arg("-I").arg(d);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("cc has no stdin")?
        .write_all(
            defines
                .iter()
                .map(|d| format!("#define {d} 1\n"))
                .chain([format!("#include <{header}>\n")])
                .collect::<String>()
                .as_bytes(),
        )
        .map_err(|e| format!("cc: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc -E {header} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text: String = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    Ok(parse_declarations(&text, ret, prefix))
}

/// [`declarations`] of preprocessed text: every `ret name(params);` with `name` starting with
/// `prefix` (the first declaration of a name wins).
fn parse_declarations(text: &str, ret: &str, prefix: &str) -> Vec<Declaration> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out: Vec<Declaration> = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(ret) {
        let start = at + i;
        at = start + ret.len();
        // `ret` must be a whole token, followed by an identifier and `(`.
        if text[..start].chars().next_back().is_some_and(ident) {
            continue;
        }
        let rest = &text[at..];
        let Some(name_len) = rest
            .trim_start()
            .find(|c: char| !ident(c))
            .filter(|&n| n > 0)
        else {
            continue;
        };
        let skipped = rest.len() - rest.trim_start().len();
        let name = &rest[skipped..skipped + name_len];
        let after = rest[skipped + name_len..].trim_start();
        if !name.starts_with(prefix) || !after.starts_with('(') {
            continue;
        }
        // The parameter list up to its matching `)`, then `;` (a declaration, not a call).
        let mut depth = 0;
        let Some(close) = after.char_indices().find_map(|(j, c)| {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(j);
                    }
                }
                _ => {}
            }
            None
        }) else {
            continue;
        };
        let tail = after[close + 1..].trim_start();
        if !(tail.starts_with(';') || tail.starts_with("__attribute__")) {
            continue;
        }
        let params: Vec<String> = after[1..close]
            .split(',')
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty() && p != "void")
            .collect();
        if !out.iter().any(|d| d.name == name) {
            out.push(Declaration {
                name: name.to_string(),
                params,
            });
        }
    }
    out
}

#[cfg(test)]
mod declaration_tests {
    use super::*;

    #[test]
    fn declarations_are_read_with_their_parameters_and_calls_are_not() {
        let text = "typedef int cublasStatus_t; cublasStatus_t cublasSaxpy_v2(cublasHandle_t h, \
                    int n, const float* alpha, const float* x, int incx, float* y, int incy); \
                    cublasStatus_t cublasCreate_v2(cublasHandle_t* handle); \
                    static int f(void) { return (cublasStatus_t) cublasNot(1); } \
                    mycublasStatus_t cublasOther(int a); \
                    cublasStatus_t cublasGetVersion(void) __attribute__((deprecated));";
        let d = parse_declarations(text, "cublasStatus_t", "cublas");
        let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["cublasSaxpy_v2", "cublasCreate_v2", "cublasGetVersion"]
        );
        assert_eq!(d[0].params.len(), 7);
        assert_eq!(d[0].params[2], "const float* alpha");
        assert!(d[2].params.is_empty());
    }
}
