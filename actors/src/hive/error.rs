use std::time::Duration;

/// Why the hive could not deliver a message or a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HiveError {
    /// No module is registered under that name (beehive would drop the message silently).
    #[error("no module named {0:?} is registered")]
    UnknownModule(String),
    /// No module is registered in that group.
    #[error("no module is registered in group {0:?}")]
    UnknownGroup(String),
    /// A module with that name is already registered.
    #[error("a module named {0:?} is already registered")]
    AlreadyRegistered(String),
    /// The module is registered under that name but has another actor type.
    #[error("module {0:?} is not of the requested actor type")]
    WrongType(String),
    /// The module's mailbox is at capacity; the message was rejected, not queued.
    #[error("mailbox of module {0:?} is full")]
    MailboxFull(String),
    /// The module is not running (it failed and is being restarted, or the process stops).
    #[error("module {0:?} is not running")]
    ModuleDown(String),
    /// The module did not reply within the timeout.
    #[error("module {module:?} did not reply within {timeout:?}")]
    Timeout {
        /// The module asked.
        module: String,
        /// How long the caller waited.
        timeout: Duration,
    },
    /// The module handled the request but sent no reply.
    #[error("module {0:?} handled the request without a reply")]
    NoReply(String),
}
