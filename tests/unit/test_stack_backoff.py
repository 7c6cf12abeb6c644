from services.stack.backoff import RestartPolicy, next_delay

POLICY = RestartPolicy(first_delay_s=1, max_delay_s=8, healthy_after_s=60)


def test_a_process_that_dies_repeatedly_waits_longer_each_time_up_to_the_cap() -> None:
    delays = []
    delay = 0.0
    for _ in range(6):
        delay = next_delay(POLICY, delay, ran_for_s=2)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 8, 8]


def test_a_process_that_ran_long_enough_restarts_quickly_again() -> None:
    assert next_delay(POLICY, 8, ran_for_s=120) == 1


def test_the_runtime_backoff_doubles_from_its_first_wait_up_to_its_cap() -> None:
    from services.runtime.backoff import Backoff

    b = Backoff(first_s=0.5, max_s=3.0)
    assert [b.for_attempt(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    waits = [0.0]
    for _ in range(4):
        waits.append(b.next(waits[-1]))
    assert waits[1:] == [0.5, 1.0, 2.0, 3.0]
