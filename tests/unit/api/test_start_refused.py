from agent_engine.api.errors import StartRefused
from agent_engine.domain.gate import LOCK_MESSAGES, AgentNotStartable, Lock


def test_a_refused_start_names_the_lock_and_says_who_can_lift_it() -> None:
    for lock in Lock:
        error = StartRefused(AgentNotStartable(7, lock))
        assert error.extensions == {"code": "AGENT_NOT_STARTABLE", "lock": lock.value}
        assert error.message == f"agent cannot start: {LOCK_MESSAGES[lock]}"
