-- Answer quality (issue 45).
--   answer_evaluations  one row per evaluation of a site's labelled questions (questions.jsonl)
--                       against a space: what the site's `answer_quality` asset plots, and the
--                       recent best its check compares the newest evaluation with.
--   space_activations   every flip of the active space: the figures the gate compared, and
--                       whether it was forced past a refusal (`space activate --force`).
CREATE TABLE answer_evaluations (
    evaluation_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    site           text NOT NULL,
    space_id       integer NOT NULL REFERENCES embedding_spaces (space_id),
    evaluated_at   timestamptz NOT NULL DEFAULT now(),
    k              integer NOT NULL,
    questions      integer NOT NULL,   -- scored (stale ones left out)
    answered       integer NOT NULL,   -- within k
    recall         double precision NOT NULL,
    mrr            double precision NOT NULL,
    stale          integer NOT NULL,
    failing        jsonb NOT NULL      -- [{question, url, kind}], the questions not answered within k
);
CREATE INDEX answer_evaluations_site ON answer_evaluations (site, evaluated_at DESC);

CREATE TABLE space_activations (
    activated_at       timestamptz NOT NULL DEFAULT now(),
    space_id           integer NOT NULL REFERENCES embedding_spaces (space_id),
    previous_space_id  integer REFERENCES embedding_spaces (space_id),
    forced             boolean NOT NULL,
    figures            jsonb NOT NULL   -- [{set, questions, active_recall, candidate_recall, active_mrr, candidate_mrr}]
);
