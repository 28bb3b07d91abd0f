"""keysvc.db.dialect: a statement's PostgreSQL text, its ``?`` parameters numbered
and nothing else changed; a statement with a PostgreSQL form of its own runs that."""

from keysvc.db.dialect import Sql, postgres_text, with_json_list


def test_parameters_are_numbered_in_order() -> None:
    assert postgres_text("select a from t where b = ? and c in (?, ?)") == (
        "select a from t where b = $1 and c in ($2, $3)"
    )


def test_a_question_mark_quoted_is_no_parameter() -> None:
    sql = "select '?', \"odd?\", 'it''s ?' from t where a = ?"
    assert postgres_text(sql) == "select '?', \"odd?\", 'it''s ?' from t where a = $1"


def test_a_pair_is_sqlites_text_and_runs_its_own_form_on_postgresql() -> None:
    pair = Sql(
        "insert or ignore into t values (?)", "insert into t values (?) on conflict do nothing"
    )
    assert pair == "insert or ignore into t values (?)"
    assert postgres_text(pair) == "insert into t values ($1) on conflict do nothing"


def test_a_json_list_is_json_each_or_jsonb_array_elements() -> None:
    pair = with_json_list("select id from t where a = ? and id in {json_list}")
    assert pair == "select id from t where a = ? and id in (select value from json_each(?))"
    assert postgres_text(pair) == (
        "select id from t where a = $1 and id in (select jsonb_array_elements_text($2::jsonb))"
    )
