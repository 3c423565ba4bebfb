//! Build script: with feature `rdma`, compiles the small C shim over libfabric's `static inline` calls and
//! generates Rust declarations for it (and the libfabric constants it uses) with bindgen. Without the
//! feature it does nothing.

fn main() {
    #[cfg(feature = "rdma")]
    rdma::build();
}

#[cfg(feature = "rdma")]
mod rdma {
    use std::env;
    use std::path::PathBuf;

    const HEADER: &str = "csrc/rdma_shim.h";
    const SOURCE: &str = "csrc/rdma_shim.c";
    const FABRIC_H: &str = "/usr/include/rdma/fabric.h";

    pub(crate) fn build() {
        println!("cargo:rerun-if-changed={HEADER}");
        println!("cargo:rerun-if-changed={SOURCE}");
        println!("cargo:rerun-if-env-changed=LIBFABRIC_INCLUDE");
        let include = env::var("LIBFABRIC_INCLUDE").ok();
        if include.is_none() && !std::path::Path::new(FABRIC_H).exists() {
            panic!(
                "feature `rdma` needs libfabric's headers ({FABRIC_H}): install `libfabric-dev` \
                 (scripts/install-deps.sh does), or point LIBFABRIC_INCLUDE at their directory"
            );
        }
        let mut cc = cc::Build::new();
        cc.file(SOURCE).warnings(true);
        if let Some(dir) = &include {
            cc.include(dir);
        }
        cc.compile("te_rdma_shim");
        println!("cargo:rustc-link-lib=fabric");

        let mut builder = bindgen::Builder::default()
            .header(HEADER)
            .rust_target(bindgen::RustTarget::stable(85, 0).unwrap_or_default())
            .rust_edition(bindgen::RustEdition::Edition2024)
            .allowlist_function("te_.*")
            .allowlist_function("fi_strerror")
            .allowlist_var("FI_.*")
            .allowlist_type("fi_cq_data_entry")
            .opaque_type("fid_.*")
            .opaque_type("fi_info")
            .layout_tests(false)
            .generate_comments(false);
        if let Some(dir) = &include {
            builder = builder.clang_arg(format!("-I{dir}"));
        }
        let bindings = builder.generate().unwrap_or_else(|e| {
            panic!(
                "bindgen over {HEADER} failed ({e}): feature `rdma` needs libclang (`libclang-dev`) \
                 and libfabric's headers (`libfabric-dev`)"
            )
        });
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        bindings
            .write_to_file(out.join("fabric.rs"))
            .expect("writing the generated bindings");
    }
}
