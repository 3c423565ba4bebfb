//! `docs/CONFIGURATION.md` against the code: every configuration struct's section lists its fields in
//! order with the defaults `Debug` prints (see `tests::config_doc`).

use tests::config_doc::check;

const DOC: &str = include_str!("../../docs/CONFIGURATION.md");

/// Checks each (name, `Debug` of its default) and reports every difference at once.
fn check_all(configs: &[(&str, String)]) {
    let problems: Vec<String> = configs
        .iter()
        .filter_map(|(name, debug)| check(DOC, name, debug).err())
        .collect();
    assert!(
        problems.is_empty(),
        "docs/CONFIGURATION.md differs from the code:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_engine_and_transport_settings_are_documented_with_their_defaults() {
    use backends::tcp::{
        Buffers, Dialing, Liveness, Security, Serving, SocketBuffers, StrangerLimits, TcpConfig,
    };
    use transfer_engine::{EngineConfig, ShapingConfig};
    let mut configs = vec![
        ("EngineConfig", format!("{:?}", EngineConfig::default())),
        ("ShapingConfig", format!("{:?}", ShapingConfig::default())),
        ("TcpConfig", format!("{:?}", TcpConfig::default())),
        ("Security", format!("{:?}", Security::default())),
        ("Liveness", format!("{:?}", Liveness::default())),
        ("Dialing", format!("{:?}", Dialing::default())),
        ("StrangerLimits", format!("{:?}", StrangerLimits::default())),
        ("Serving", format!("{:?}", Serving::default())),
        ("Buffers", format!("{:?}", Buffers::default())),
        ("SocketBuffers", format!("{:?}", SocketBuffers::default())),
    ];
    #[cfg(target_os = "linux")]
    configs.push((
        "ShmConfig",
        format!("{:?}", backends::shm::ShmConfig::new(1, None)),
    ));
    #[cfg(feature = "rdma")]
    configs.push((
        "RdmaConfig",
        format!(
            "{:?}",
            backends::rdma::RdmaConfig::new(1, backends::rdma::Provider::Named("tcp".into()))
        ),
    ));
    #[cfg(not(feature = "rdma"))]
    println!("not run: the RdmaConfig section (build with feature `rdma`, as CI does)");
    check_all(&configs);
}

#[test]
fn the_connector_policy_and_simulator_settings_are_documented_with_their_defaults() {
    use connector::disk::DiskConfig;
    use connector::{ConnectorConfig, KvRole};
    use fabric_sim::{ContentionConfig, LinkConfig, OverlapConfig, ScenarioConfig};
    use policy::continuation::ContinuationConfig;
    use policy::continuation::survival::SurvivalConfig;
    use policy::{HeatConfig, TierCapacities, TierConfig};
    let configs = [
        (
            "ConnectorConfig",
            format!(
                "{:?}",
                ConnectorConfig::new(KvRole::Producer, transfer_engine::Namespace::default())
            ),
        ),
        (
            "DiskConfig",
            format!("{:?}", DiskConfig::new("/kv", 1 << 30)),
        ),
        (
            "IndexConfig",
            format!(
                "{:?}",
                cluster::IndexConfig::new("redis://127.0.0.1:6379", "10.0.0.1:7000")
            ),
        ),
        ("HeatConfig", format!("{:?}", HeatConfig::default())),
        (
            "TierConfig",
            format!("{:?}", TierConfig::new(TierCapacities::default())),
        ),
        (
            "ContinuationConfig",
            format!("{:?}", ContinuationConfig::default()),
        ),
        ("SurvivalConfig", format!("{:?}", SurvivalConfig::default())),
        ("LinkConfig", format!("{:?}", LinkConfig::default())),
        (
            "ContentionConfig",
            format!("{:?}", ContentionConfig::default()),
        ),
        ("OverlapConfig", format!("{:?}", OverlapConfig::default())),
        ("ScenarioConfig", format!("{:?}", ScenarioConfig::default())),
    ];
    check_all(&configs);
}
