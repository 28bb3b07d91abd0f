"""What the metrics tests share: a scrape of /metrics parsed into samples, one sample's
value, a request's bare status, and the bearer token /metrics is given to require."""

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Client

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

TOKEN = "s3cret-metrics-token-0123456789"


async def scrape(client: Client, headers: dict[str, str] | None = None) -> tuple[str, Samples]:
    response = await client.get("/metrics", headers=headers or {})
    text = await response.text()
    assert response.status == 200, text
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def status_of(client: Client, method: str, path: str, headers: dict[str, str]) -> int:
    response = await client.request(method, path, headers=headers)
    await response.read()
    return response.status
