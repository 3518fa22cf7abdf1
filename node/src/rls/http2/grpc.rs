//! gRPC over the listener's HTTP/2: which calls are served, their deadlines, the messages'
//! 5-byte prefix, health, and the statuses sent back.

use std::fmt::Write;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::frame;

/// A call not answered in this time is refused (Envoy's own timeout is usually 20 ms to 1 s).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// A gRPC message's prefix: the compressed flag and the length, big-endian.
pub(super) const PREFIX_BYTES: usize = 5;

pub(super) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
pub(super) const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
pub(super) const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
/// The services health answers SERVING for (the empty name is the server as a whole).
pub(super) const HEALTHY_SERVICES: [&str; 2] = ["", "envoy.service.ratelimit.v3.RateLimitService"];

/// The methods served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    ShouldRateLimit,
    HealthCheck,
    HealthWatch,
}

/// What a call gets instead of being served.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Not gRPC at all: an HTTP status.
    Http(u16),
    Grpc(Status),
}

/// The request headers the listener looks at, read as they are decoded (nothing kept but
/// what a refusal shows).
#[derive(Debug, Default)]
pub(super) struct RequestHead {
    post: bool,
    grpc: bool,
    /// The method asked for, or the path (its first 200 characters) when none is served there.
    path: Option<Result<Route, String>>,
    /// The caller's `grpc-timeout`, or the value refused (its first 32 bytes).
    timeout: Option<Result<Duration, String>>,
}

impl RequestHead {
    pub(super) fn note(&mut self, name: &[u8], value: &[u8]) {
        match name {
            b":method" => self.post = value == b"POST",
            b"content-type" => self.grpc = is_grpc_content_type(value),
            b":path" => {
                self.path = Some(match value {
                    p if p == SHOULD_RATE_LIMIT.as_bytes() => Ok(Route::ShouldRateLimit),
                    p if p == HEALTH_CHECK.as_bytes() => Ok(Route::HealthCheck),
                    p if p == HEALTH_WATCH.as_bytes() => Ok(Route::HealthWatch),
                    other => Err(String::from_utf8_lossy(&other[..other.len().min(800)])
                        .chars()
                        .take(200)
                        .collect()),
                });
            }
            b"grpc-timeout" => {
                self.timeout = Some(parse_timeout(value).ok_or_else(|| {
                    String::from_utf8_lossy(&value[..value.len().min(32)]).into_owned()
                }));
            }
            _ => {}
        }
    }
}

/// `application/grpc`, alone or with a `+codec` or `;parameters` (not grpc-web's framing).
fn is_grpc_content_type(value: &[u8]) -> bool {
    value
        .strip_prefix(b"application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

/// The method a call asks for and its `grpc-timeout`, or why it is refused.
pub(super) fn route(head: &RequestHead) -> Result<(Route, Option<Duration>), Refusal> {
    if !head.post {
        return Err(Refusal::Http(405));
    }
    if !head.grpc {
        return Err(Refusal::Http(415));
    }
    let route = match &head.path {
        Some(Ok(route)) => *route,
        Some(Err(shown)) => {
            return Err(Refusal::Grpc(Status::unimplemented(format!(
                "no method `{shown}` here: this listener serves {SHOULD_RATE_LIMIT} and gRPC health"
            ))));
        }
        None => {
            return Err(Refusal::Grpc(Status::unimplemented(format!(
                "no method asked for: this listener serves {SHOULD_RATE_LIMIT} and gRPC health"
            ))));
        }
    };
    let asked = match &head.timeout {
        None => None,
        Some(Ok(asked)) => Some(*asked),
        Some(Err(shown)) => {
            return Err(Refusal::Grpc(Status::invalid_argument(format!(
                "grpc-timeout `{shown}` is not 1 to 8 digits and a unit (H, M, S, m, u or n)"
            ))));
        }
    };
    Ok((route, asked))
}

/// A unary call's deadline: the caller's `grpc-timeout`, at most CALL_TIMEOUT (CALL_TIMEOUT
/// without one).
pub(super) fn call_deadline(asked: Option<Duration>) -> Duration {
    asked.map_or(CALL_TIMEOUT, |asked| asked.min(CALL_TIMEOUT))
}

/// gRPC's timeout: at most eight ASCII digits, then H, M, S, m, u or n.
pub(super) fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3_600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

pub(super) fn over_limit(max_message: usize) -> Status {
    Status::resource_exhausted(format!(
        "the message is over {max_message} bytes, the node's --max-frame-bytes"
    ))
}

/// The message inside a unary call's body: exactly one, uncompressed.
pub(super) fn unframe(mut body: Bytes, max_message: usize) -> Result<Bytes, Status> {
    let Some((prefix, _)) = body.split_first_chunk::<PREFIX_BYTES>() else {
        return Err(Status::internal("the call carried no message"));
    };
    match prefix[0] {
        0 => {}
        1 => {
            return Err(Status::unimplemented(
                "compressed messages are not accepted: send them uncompressed",
            ));
        }
        flag => {
            return Err(Status::internal(format!(
                "the message's compressed flag is {flag}: 0 or 1"
            )));
        }
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if length > max_message {
        return Err(over_limit(max_message));
    }
    let carried = body.len() - PREFIX_BYTES;
    if carried != length {
        return Err(Status::internal(format!(
            "a unary call carries one message of {length} bytes; this one carried {carried}"
        )));
    }
    // Advanced rather than sliced: the message stays the body's one owner.
    body.advance(PREFIX_BYTES);
    Ok(body)
}

/// The length of `message` with its prefix, or why it is not sent.
pub(super) fn framed_length(message: &impl Message, max_message: usize) -> Result<usize, Status> {
    let length = message.encoded_len();
    if length > max_message {
        return Err(Status::internal(format!(
            "the answer is {length} bytes, over the node's --max-frame-bytes {max_message}"
        )));
    }
    Ok(PREFIX_BYTES + length)
}

/// Appends `message` with its prefix; its length was checked by `framed_length`.
pub(super) fn put_framed(out: &mut BytesMut, message: &impl Message) {
    out.put_u8(0);
    out.put_u32(u32::try_from(message.encoded_len()).unwrap_or(u32::MAX));
    // A `BytesMut` grows as needed: encoding into it cannot run out of room.
    let _ = message.encode(out);
}

/// `message`, prefixed for gRPC.
pub(super) fn encode(message: &impl Message, max_message: usize) -> Result<Bytes, Status> {
    let mut framed = BytesMut::with_capacity(framed_length(message, max_message)?);
    put_framed(&mut framed, message);
    Ok(framed.freeze())
}

pub(super) fn decode_health(message: Bytes) -> Result<HealthCheckRequest, Status> {
    HealthCheckRequest::decode(message)
        .map_err(|e| Status::invalid_argument(format!("not a HealthCheckRequest: {e}")))
}

/// SERVING for the services served here, NOT_SERVING once the node is stopping (a load
/// balancer should send new calls elsewhere while it drains).
pub(super) fn health_of(
    request: &HealthCheckRequest,
    stopping: bool,
) -> Result<HealthCheckResponse, Status> {
    if !HEALTHY_SERVICES.contains(&request.service.as_str()) {
        return Err(Status::not_found(format!(
            "no service `{}` here",
            request.service.chars().take(200).collect::<String>()
        )));
    }
    Ok(serving(if stopping {
        ServingStatus::NotServing
    } else {
        ServingStatus::Serving
    }))
}

pub(super) fn serving(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

/// The header block of a refusal: gRPC's trailers-only answer (the status in the headers), or an
/// HTTP status for what is not gRPC.
pub(super) fn refusal_block(refusal: &Refusal) -> BytesMut {
    let mut block = BytesMut::with_capacity(128);
    match refusal {
        Refusal::Http(code) => frame::put_status(&mut block, *code),
        Refusal::Grpc(status) => {
            block.extend_from_slice(frame::GRPC_HEAD);
            put_status_fields(&mut block, status);
        }
    }
    block
}

/// `status` as gRPC's trailers.
pub(super) fn trailers_block(status: &Status) -> BytesMut {
    let mut block = BytesMut::with_capacity(96);
    put_status_fields(&mut block, status);
    block
}

fn put_status_fields(block: &mut BytesMut, status: &Status) {
    let code = (status.code() as i32).to_string();
    frame::put_field(block, b"grpc-status", code.as_bytes());
    if !status.message().is_empty() {
        // Cut so that any refusal fits one HEADERS frame of HTTP/2's least size.
        let message: String = status.message().chars().take(1_024).collect();
        frame::put_field(block, b"grpc-message", percent_encoded(&message).as_bytes());
    }
}

/// `grpc-message`'s encoding: bytes outside printable ASCII, and `%`, as `%XX`.
pub(super) fn percent_encoded(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_refuse_the_rest() {
        assert_eq!(parse_timeout(b"20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"7n"), Some(Duration::from_nanos(7)));
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"12x",
            b"-1S",
            b"1.5S",
            b"S1",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    fn head(method: &str, path: &str, content_type: Option<&str>) -> RequestHead {
        let mut head = RequestHead::default();
        head.note(b":method", method.as_bytes());
        head.note(b":path", path.as_bytes());
        if let Some(t) = content_type {
            head.note(b"content-type", t.as_bytes());
        }
        head
    }

    #[test]
    fn a_timeout_is_held_to_the_call_timeout() {
        let mut asked = head("POST", SHOULD_RATE_LIMIT, Some("application/grpc"));
        let deadline = |head: &RequestHead| route(head).map(|(_, asked)| call_deadline(asked));
        assert_eq!(deadline(&asked).unwrap(), CALL_TIMEOUT);
        asked.note(b"grpc-timeout", b"250m");
        assert_eq!(deadline(&asked).unwrap(), Duration::from_millis(250));
        asked.note(b"grpc-timeout", b"1H");
        assert_eq!(deadline(&asked).unwrap(), CALL_TIMEOUT);
        assert_eq!(
            route(&asked).unwrap().1,
            Some(Duration::from_secs(3_600)),
            "a Watch gets what it asked"
        );
        asked.note(b"grpc-timeout", b"soon");
        assert!(matches!(
            deadline(&asked),
            Err(Refusal::Grpc(s)) if s.code() == tonic::Code::InvalidArgument
        ));
    }

    fn framed(flag: u8, length: u32, payload: &[u8]) -> Bytes {
        let mut body = vec![flag];
        body.extend_from_slice(&length.to_be_bytes());
        body.extend_from_slice(payload);
        Bytes::from(body)
    }

    #[test]
    fn a_unary_body_holds_exactly_one_uncompressed_message_within_the_limit() {
        assert_eq!(unframe(framed(0, 3, b"abc"), 10).unwrap(), &b"abc"[..]);
        assert_eq!(unframe(framed(0, 0, b""), 10).unwrap(), &b""[..]);
        let code = |body, max| unframe(body, max).unwrap_err().code();
        assert_eq!(code(Bytes::new(), 10), tonic::Code::Internal, "no message");
        assert_eq!(
            code(Bytes::from_static(b"\0\0\0"), 10),
            tonic::Code::Internal
        );
        assert_eq!(code(framed(1, 3, b"abc"), 10), tonic::Code::Unimplemented);
        assert_eq!(code(framed(2, 3, b"abc"), 10), tonic::Code::Internal);
        assert_eq!(
            code(framed(0, 11, &[0; 11]), 10),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(
            code(framed(0, 4, b"abc"), 10),
            tonic::Code::Internal,
            "cut short"
        );
        assert_eq!(
            code(framed(0, 2, b"abc"), 10),
            tonic::Code::Internal,
            "two messages"
        );
    }

    #[test]
    fn messages_round_trip_through_the_prefix_and_an_oversized_answer_is_refused() {
        let asked = HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        };
        let framed = encode(&asked, 1_000).unwrap();
        assert_eq!(framed[0], 0);
        assert_eq!(framed.len(), PREFIX_BYTES + asked.encoded_len());
        let back = decode_health(unframe(framed, 1_000).unwrap()).unwrap();
        assert_eq!(back, asked);
        assert_eq!(
            health_of(&back, false).unwrap().status,
            ServingStatus::Serving as i32
        );
        assert_eq!(
            encode(&asked, 10).unwrap_err().code(),
            tonic::Code::Internal
        );
    }

    #[test]
    fn health_knows_the_server_and_the_rls_service_only() {
        for served in HEALTHY_SERVICES {
            let asked = HealthCheckRequest {
                service: served.into(),
            };
            assert_eq!(
                health_of(&asked, false).unwrap().status,
                ServingStatus::Serving as i32
            );
            assert_eq!(
                health_of(&asked, true).unwrap().status,
                ServingStatus::NotServing as i32,
                "a draining node sends new calls elsewhere"
            );
        }
        let other = HealthCheckRequest {
            service: "grpc.reflection".into(),
        };
        assert_eq!(
            health_of(&other, false).unwrap_err().code(),
            tonic::Code::NotFound
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded_outside_printable_ascii() {
        assert_eq!(percent_encoded("plain text: ok"), "plain text: ok");
        assert_eq!(percent_encoded("100%"), "100%25");
        assert_eq!(percent_encoded("a\nb"), "a%0Ab");
        assert_eq!(percent_encoded("é"), "%C3%A9");
    }

    #[test]
    fn only_grpc_posts_to_the_served_methods_are_routed() {
        let grpc = Some("application/grpc");
        let routed = |head: &RequestHead| route(head).map(|(route, _)| route);
        assert_eq!(
            routed(&head("POST", SHOULD_RATE_LIMIT, grpc)).unwrap(),
            Route::ShouldRateLimit
        );
        assert_eq!(
            routed(&head("POST", HEALTH_CHECK, Some("application/grpc+proto"))).unwrap(),
            Route::HealthCheck
        );
        assert_eq!(
            routed(&head("POST", HEALTH_WATCH, grpc)).unwrap(),
            Route::HealthWatch
        );
        assert!(matches!(
            routed(&head("GET", SHOULD_RATE_LIMIT, grpc)),
            Err(Refusal::Http(405))
        ));
        for refused in [Some("application/json"), Some("application/grpc-web"), None] {
            assert!(matches!(
                routed(&head("POST", SHOULD_RATE_LIMIT, refused)),
                Err(Refusal::Http(415))
            ));
        }
        assert!(matches!(
            routed(&head("POST", "/pkg.Other/Call", grpc)),
            Err(Refusal::Grpc(s)) if s.code() == tonic::Code::Unimplemented
        ));
    }
}
