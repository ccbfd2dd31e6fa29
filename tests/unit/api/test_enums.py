from agent_engine.api.enums import AgentStatus
from agent_engine.domain import gate


def test_every_agent_status_of_the_gate_is_served_under_its_own_name() -> None:
    assert [s.name for s in AgentStatus] == [s.name for s in gate.AgentStatus]
    for status in gate.AgentStatus:
        assert AgentStatus(status).name == status.name
