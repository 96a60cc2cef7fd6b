-- A page robots.txt disallows: found so by the local crawler (which then did not fetch it) or by a
-- reading of its site (whatever crawls it: Crawlbase reads no robots.txt). It is out of the recrawl
-- queue until robots.txt is read again (its next crawl moved past the crawler's robots.txt TTL, or
-- past its site's next reading), and back in it, due now, once robots.txt allows it.
ALTER TABLE pages ADD COLUMN disallowed_at timestamptz;   -- when robots.txt last said no; NULL: it does not
ALTER TABLE pages ADD COLUMN disallowed_rule text;        -- the rule, e.g. robots.txt: Disallow: /drafts/ (group for '*')
ALTER TABLE pages ADD COLUMN disallowed_url text;         -- what it disallows: the page's URL, or a hop of its redirect
CREATE INDEX pages_disallowed ON pages (site) WHERE disallowed_at IS NOT NULL;

-- A push the crawler did not fetch because robots.txt disallows it: no crawler failure, a verdict.
ALTER TABLE pushes DROP CONSTRAINT pushes_result_check;
ALTER TABLE pushes ADD CONSTRAINT pushes_result_check
    CHECK (result IN ('pending', 'pushed', 'failed', 'disallowed')) NOT VALID;
ALTER TABLE pushes VALIDATE CONSTRAINT pushes_result_check;
