//! Resource strings (`route.resource` of every message): the edge, cloud and device forms
//! and the conversions CloudHub applies. A parsed resource prints back to a string that
//! parses to the same resource, and the cloud form converts to the edge form it names.
#![no_main]

use edgehive_protocols::{
    node_of, prefix_for_cloud, trim_for_edge, CloudResource, DeviceResource, EdgeResource,
};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

fuzz_target!(|data: &[u8]| {
    // Resources arrive inside JSON strings: always UTF-8.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(edge) = EdgeResource::parse(text) {
        assert_eq!(EdgeResource::parse(&edge.key()), Ok(edge.clone()));
    }
    if let Ok(cloud) = CloudResource::parse(text) {
        let printed = cloud.to_string();
        assert_eq!(CloudResource::parse(&printed), Ok(cloud.clone()));
        assert_eq!(
            EdgeResource::parse(&trim_for_edge(&printed)),
            Ok(cloud.to_edge())
        );
        assert_eq!(node_of(&printed), Some(cloud.node.as_str()));
        assert_eq!(
            prefix_for_cloud(&cloud.node, &cloud.to_edge().key()),
            printed
        );
    }
    if let Ok(device) = DeviceResource::parse(text) {
        assert_eq!(
            DeviceResource::parse(&device.to_string()),
            Ok(device.clone())
        );
    }
    let _ = (node_of(text), trim_for_edge(text));
});
