//! Writes `src/gateway/aip/proto/grpc_service.rs` (see Cargo.toml beside this file).

use std::path::Path;

const GENERATED_FIELD: &str = r#"    #[prost(map = "string, string", tag = "5")]
    pub arguments: ::std::collections::HashMap<
        ::prost::alloc::string::String,
        ::prost::alloc::string::String,
    >,
}
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ToolResponse {"#;

const EDITED_FIELD: &str = r#"    /// EDITED BY HAND (the one change to the generated code; `proto.rs` says why): field 5 is
    /// `map<string, string>` in the seed's schema and `string` (JSON) in the next upstream
    /// version. Both are length-delimited under the same tag, so each occurrence is kept here
    /// as raw bytes and read by `proto::arguments` (a map entry, or a JSON object's text).
    #[prost(bytes = "vec", repeated, tag = "5")]
    pub arguments: ::prost::alloc::vec::Vec<::prost::alloc::vec::Vec<u8>>,
}
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ToolResponse {"#;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("src/gateway/aip/proto");
    let out = std::env::temp_dir().join(format!("aip-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("a temporary directory");
    let fds = protox::compile([dir.join("schema.proto")], [&dir]).expect("schema.proto compiles");
    let mut config = prost_build::Config::new();
    config.out_dir(&out);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(&out)
        .compile_fds_with_config(fds, config)
        .expect("code generated");
    let code = std::fs::read_to_string(out.join("grpc_service.rs")).expect("generated file");
    assert!(
        code.contains(GENERATED_FIELD),
        "ToolRequest.arguments is not where it was"
    );
    let code = code.replace(GENERATED_FIELD, EDITED_FIELD);
    std::fs::write(dir.join("grpc_service.rs"), code).expect("written");
    let _ = std::fs::remove_dir_all(&out);
    println!("wrote {}", dir.join("grpc_service.rs").display());
}
