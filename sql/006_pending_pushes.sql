-- A push run that dies between recording its pushes as pending and finishing them leaves them
-- pending forever; recrawl_sensor expires them (pushes.expire_pending). This keeps that cheap.
CREATE INDEX pushes_pending ON pushes (pushed_at) WHERE result = 'pending';
