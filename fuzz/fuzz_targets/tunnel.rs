//! The stream tunnel codec (`edgehive_protocols::tunnel`): any bytes an edge sends in a tunnel
//! message. Besides not panicking: the data limit refuses exactly what is over it and changes
//! nothing else, a decoded message re-encodes to the same bytes, and a connect request that
//! parses writes JSON that parses to the same request.
#![no_main]

use edgehive_protocols::tunnel::{
    decode_tunnel, decode_tunnel_with_limit, encode_tunnel, ConnectRequest, TunnelError,
};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

fuzz_target!(|data: &[u8]| {
    let decoded = decode_tunnel(data);
    if let Ok(frame) = decoded {
        assert_eq!(frame.encode(), data, "re-encoding changed the frame");
        assert_eq!(
            encode_tunnel(frame.connect_id, frame.kind, frame.data),
            data
        );
        assert_eq!(decode_tunnel_with_limit(data, frame.data.len()), decoded);
        if let Some(shorter) = frame.data.len().checked_sub(1) {
            assert!(matches!(
                decode_tunnel_with_limit(data, shorter),
                Err(TunnelError::TooLarge { .. })
            ));
        }
        if frame.kind.is_connect() {
            if let Ok(request) = ConnectRequest::from_json(frame.data) {
                let json = request.to_json();
                match ConnectRequest::from_json(&json) {
                    Ok(again) => assert_eq!(again, request),
                    Err(error) => panic!("a written connect request does not parse: {error}"),
                }
            }
        }
    } else if let Err(error) = decoded {
        let _ = error.reason();
    }
});
